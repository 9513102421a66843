"""Dead-letter copies of persistent messages go through the log, ahead of the original's removal;
what nobody dead-letters is dropped unread."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.deaths import deaths_of

from sluicegate.queues.log.segments import SegmentWriter, segment_path
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.message import Message
from sluicegate.queues.paging import RESIDENT_READY
from sluicegate.queues.queue_type import Clock
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.annotations import read_stream_offset
from sluicegate.wire.decoding import MAX_DEPTH
from sluicegate.wire.encoding import encode


def _persistent(body: str) -> bytes:
    """A message whose header says durable = true."""
    return encode(Described(0x70, [True])) + encode(Described(0x77, body))


def _registry(store: MessageStore) -> QueueRegistry:
    registry = QueueRegistry(Clock(1_700_000_000_000), store=store)
    registry.declare_exchange("dlx", "fanout")
    registry.declare_queue("dead")
    registry.bind("dlx", "dead", "")
    registry.declare_queue("work", {"x-max-length": 1, "x-dead-letter-exchange": "dlx"})
    return registry


def _publish(registry: QueueRegistry, store: MessageStore, body: str) -> None:
    stored = store.enqueue("work", _persistent(body), registry.clock.now)
    registry.queue("work").enqueue(stored)


# Each case replays every prefix of its batch; the topology changes are the long ones.
@pytest.mark.parametrize(
    "topology_change",
    [
        "none",
        pytest.param("delete_queue", marks=pytest.mark.slow),
        pytest.param("unbind", marks=pytest.mark.slow),
        pytest.param("delete_exchange", marks=pytest.mark.slow),
    ],
)
def test_a_crash_anywhere_in_the_dead_lettering_batch_keeps_the_message(
    tmp_path: Path, topology_change: str
) -> None:
    """m0 overflows (maxlen) into the durable DLQ: every prefix of that batch keeps m0.

    A removal from the topology in the same pass, before the dead letter is routed, must not
    put m0's settlement ahead of its copy.
    """
    directory = tmp_path / "log"
    store = MessageStore(directory)
    writer = SegmentWriter(directory)
    registry = _registry(store)
    registry.declare_exchange("other-x", "fanout")
    registry.declare_queue("other")
    registry.bind("other-x", "other", "")
    _publish(registry, store, "m0")
    write_now(store, writer)
    before = segment_path(directory, 1).stat().st_size
    _publish(registry, store, "m1")
    if topology_change == "delete_queue":
        registry.delete_queue("other")
    elif topology_change == "unbind":
        registry.unbind("other-x", "other", "")
    elif topology_change == "delete_exchange":
        registry.delete_exchange("other-x")
    assert registry.route_dead_letters() == []
    assert registry.queue("dead").statistics().ready == 1
    # m1 and the dead-letter copy wait for the batch; m0's settlement is buffered behind them.
    assert store.statistics().unwritten_messages == 2
    write_now(store, writer)
    store.close()
    full = segment_path(directory, 1).read_bytes()
    assert len(full) > before

    outcomes: set[tuple[bool, bool]] = set()
    for cut in range(before, len(full) + 1):
        crashed = tmp_path / f"crash-{cut}"
        shutil.copytree(directory, crashed)
        segment_path(crashed, 1).write_bytes(full[:cut])
        again = MessageStore(crashed)
        work = [m.read() for m in again.iter_recovered_messages("work")]
        dead = [m.read() for m in again.iter_recovered_messages("dead")]
        again.close()
        shutil.rmtree(crashed)
        in_work = _persistent("m0") in work
        in_dead = len(dead) == 1 and deaths_of(dead[0]) != []
        assert in_work or in_dead, f"m0 lost with the log cut at byte {cut}"
        outcomes.add((in_work, in_dead))
    # Whole batch: only the dead-letter copy; torn before the settlement: both (a duplicate).
    assert (False, True) in outcomes
    assert (True, True) in outcomes


def test_a_dead_letter_to_a_transient_queue_or_of_a_transient_message_is_not_logged(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path)
    registry = _registry(store)
    registry.declare_queue("memory-dead", durable=False)
    registry.bind("dlx", "memory-dead", "")
    _publish(registry, store, "m0")
    _publish(registry, store, "m1")
    registry.route_dead_letters()
    assert [registry.queue(q).statistics().ready for q in ("dead", "memory-dead")] == [1, 1]
    # m0, m1 and the copy in the durable DLQ; the copy in the transient one stays in memory.
    assert store.statistics().unwritten_messages == 3
    registry.declare_queue("plain", {"x-max-length": 1, "x-dead-letter-exchange": "dlx"})
    for body in ("t0", "t1"):
        registry.queue("plain").enqueue(Message(encode(Described(0x77, body))))
    registry.route_dead_letters()
    assert [registry.queue(q).statistics().ready for q in ("dead", "memory-dead")] == [2, 2]
    assert store.statistics().unwritten_messages == 3


def test_a_dead_letter_to_a_durable_stream_is_logged_with_its_offset(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    registry = _registry(store)
    registry.declare_queue("audit", {"x-queue-type": "stream"})
    registry.bind("dlx", "audit", "")
    _publish(registry, store, "m0")
    _publish(registry, store, "m1")
    registry.route_dead_letters()
    write_now(store, writer)
    store.close()

    again = MessageStore(tmp_path)
    [dead] = list(again.iter_recovered_messages("dead"))
    [audit] = list(again.iter_recovered_messages("audit"))
    assert [m.read() for m in again.iter_recovered_messages("work")] == [_persistent("m1")]
    assert [entry[Symbol("reason")] for entry in deaths_of(audit.read())] == ["maxlen"]
    assert [entry[Symbol("queue")] for entry in deaths_of(dead.read())] == ["work"]
    assert read_stream_offset(audit.read()) == 0


def test_a_dead_letter_that_fails_stays_in_its_queue_and_the_rest_of_the_batch_goes_on(
    tmp_path: Path,
) -> None:
    """A message the door would refuse today (its message annotations nested past the codec's
    depth), as an older server's log may hold it: its dead-lettering fails, alone, and it stays
    in its queue and in the log as it was (not logged again, not settled)."""
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    registry = _registry(store)
    registry.declare_queue("victim", {"x-max-length": 1, "x-dead-letter-exchange": "dlx"})
    deep: Value = "poison"
    for _ in range(MAX_DEPTH + 6):
        deep = [deep]
    poison = encode(Described(0x70, [True])) + encode(Described(0x72, {Symbol("x-d"): deep}))
    poison += encode(Described(0x77, "p"))
    stored = store.enqueue("work", poison, registry.clock.now)
    registry.queue("work").enqueue(stored)
    _publish(registry, store, "w1")  # pushes the poison out first: it leads the batch
    victim = registry.queue("victim")
    for body in ("v0", "v1", "v2"):
        victim.enqueue(store.enqueue("victim", _persistent(body), registry.clock.now))
    registry.route_dead_letters()
    [failure] = registry.dead_letter_router.failures
    assert (failure.queue, failure.kept) == ("work", True)
    assert failure.message == f"maxlen message 0 (log id {stored.message_id})"
    assert "nested deeper" in failure.error
    # The victims' letters, after the poison in the batch, went through; the poison stays
    # where it was, not ready, so w1 fits in the queue of one.
    assert registry.queue("dead").statistics().ready == 2
    work = registry.queue("work").statistics()
    assert (work.ready, work.dead_letter_failed) == (1, 1)
    before = store.next_id
    write_now(store, writer)
    assert registry.route_dead_letters() == []
    assert len(registry.dead_letter_router.failures) == 1
    store.close()
    again = MessageStore(tmp_path)
    assert again.next_id == before
    recovered = list(again.iter_recovered_messages("work"))
    assert [(m.message_id, m.read()) for m in recovered] == [
        (stored.message_id, poison),
        (stored.message_id + 1, _persistent("w1")),
    ]
    dead = [m.read() for m in again.iter_recovered_messages("dead")]
    assert [str(deaths_of(m)[0][Symbol("queue")]) for m in dead] == ["victim", "victim"]


def test_expiry_and_purge_of_a_paged_backlog_read_no_body(tmp_path: Path) -> None:
    """Without a dead-letter exchange nothing needs an expired or purged message's body."""
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    registry = QueueRegistry(Clock(1_700_000_000_000), store=store)
    queues = {
        name: registry.declare_queue(name, arguments)
        for name, arguments in (("ttl", {"x-message-ttl": 1000}), ("purged", {}))
    }
    for index in range(3 * RESIDENT_READY):
        for name, queue in queues.items():
            queue.enqueue(store.enqueue(name, _persistent(f"m{index}"), registry.clock.now))
        if index % 1000 == 999:
            write_now(store, writer)
    write_now(store, writer)
    before = store.statistics()
    registry.clock.now += 2000
    registry.expire()
    assert registry.purge_queue("purged") == 3 * RESIDENT_READY
    after = store.statistics()
    assert [queue.statistics().ready for queue in queues.values()] == [0, 0]
    assert queues["ttl"].statistics().expired == 3 * RESIDENT_READY
    assert (after.page_reads, after.body_reads) == (before.page_reads, before.body_reads)
