"""Compaction's rules: a segment goes only when replay without it would rebuild the same state."""

from __future__ import annotations

from sluicegate.queues.log.ledger import SegmentLedger


def _ledger(*segments: int) -> SegmentLedger:
    ledger = SegmentLedger()
    for segment in segments:
        ledger.open_segment(segment)
    return ledger


def test_a_segment_whose_messages_are_all_settled_goes() -> None:
    ledger = _ledger(1, 2)
    ledger.enqueued(1)
    ledger.settled(1, 1)
    assert ledger.collect(active=2) == [1]
    assert ledger.segments == [2]


def test_the_active_segment_is_never_collected() -> None:
    ledger = _ledger(1)
    assert ledger.collect(active=1) == []


def test_a_live_message_keeps_its_segment() -> None:
    ledger = _ledger(1, 2, 3)
    ledger.enqueued(1)
    ledger.enqueued(2)
    ledger.settled(2, 2)
    assert ledger.collect(active=3) == [2]
    assert ledger.live(1) == 1


def test_a_segment_that_settles_an_older_live_segment_waits_for_it() -> None:
    # Segment 2 settles a message of segment 1 that still has another live message: deleting
    # segment 2 first would resurrect the settled message on replay.
    ledger = _ledger(1, 2, 3)
    ledger.enqueued(1)
    ledger.enqueued(1)
    ledger.settled(1, 2)
    assert ledger.collect(active=3) == []
    ledger.settled(1, 3)
    assert ledger.collect(active=3) == [1, 2]


def test_topology_removals_wait_for_every_older_segment() -> None:
    # Segment 1 declares a queue (in its snapshot) and pins a message; segment 2 deletes the
    # queue. Without segment 2 the queue would come back.
    ledger = _ledger(1, 2, 3)
    ledger.enqueued(1)
    ledger.topology_removed(2)
    assert ledger.collect(active=3) == []
    ledger.settled(1, 3)
    assert ledger.collect(active=3) == [1, 2]
