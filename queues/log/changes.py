"""Message state changes waiting for the next batch: settled, acquired, returned, counted.

Changes are buffered in order and placed when the batch is taken, consecutive ones of a kind in
one record: a dead letter routed later in the same pass then has its copy's enqueue placed before
its original's settlement. Failed-delivery counts are kept for every live message that has one,
and the messages consumers hold, and both are logged again at the start of every segment
(:meth:`StateChanges.snapshot`), so compacting the segment that counted a failure or recorded an
acquisition loses nothing: a delivery held across it comes back with its exact count.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from sluicegate.queues.log.ledger import SegmentLedger
from sluicegate.queues.log.placement import Placement
from sluicegate.queues.log.records import (
    RecordType,
    encode_delivery_counts,
    encode_messages_changed,
)

# Message ids per record: bounds one record's size (8 to 12 bytes per id).
_IDS_PER_RECORD: Final = 65536


class _Run:
    """Consecutive changes of one kind: their ids and their messages' segments, one list each
    (a change costs two appends, no tuple)."""

    __slots__ = ("ids", "kind", "segments")

    def __init__(self, kind: RecordType) -> None:
        self.kind = kind
        self.ids: list[int] = []
        self.segments: list[int] = []


class StateChanges:
    """The buffer of changes, and the live messages' delivery counts."""

    __slots__ = ("acquired", "buffer", "counts")

    def __init__(self) -> None:
        # Runs of changes, in order; a run holds at most _IDS_PER_RECORD, one record's worth.
        self.buffer: list[_Run] = []
        self.counts: dict[int, int] = {}
        # The messages a consumer holds: a crash gives each one more failed delivery.
        self.acquired: set[int] = set()

    def _add(self, kind: RecordType, message_id: int, segment: int) -> None:
        buffer = self.buffer
        run = buffer[-1] if buffer else None
        if run is None or run.kind is not kind or len(run.ids) >= _IDS_PER_RECORD:
            run = _Run(kind)
            buffer.append(run)
        run.ids.append(message_id)
        run.segments.append(segment)

    def _extend(self, kind: RecordType, ids: list[int], segments: list[int]) -> None:
        """:meth:`_add` for each of ``ids`` (of ``segments``), a run's worth at a time."""
        buffer = self.buffer
        start = 0
        while start < len(ids):
            run = buffer[-1] if buffer else None
            if run is None or run.kind is not kind or len(run.ids) >= _IDS_PER_RECORD:
                run = _Run(kind)
                buffer.append(run)
            stop = start + _IDS_PER_RECORD - len(run.ids)
            run.ids.extend(ids[start:stop])
            run.segments.extend(segments[start:stop])
            start = stop

    def acquire(self, message_id: int, segment: int) -> None:
        """A consumer holds the message ``message_id``."""
        self._add(RecordType.ACQUIRE, message_id, segment)
        self.acquired.add(message_id)

    def acquire_all(self, ids: list[int], segments: list[int]) -> None:
        """:meth:`acquire` for each of ``ids``, in order (of ``segments``)."""
        self._extend(RecordType.ACQUIRE, ids, segments)
        self.acquired.update(ids)

    def give_back(self, message_id: int, segment: int) -> None:
        """The message came back to its queue without a failed delivery."""
        self._add(RecordType.RETURN, message_id, segment)
        self.acquired.discard(message_id)

    def settle(self, message_id: int, segment: int) -> None:
        """The message is archived: its count goes with it."""
        self._add(RecordType.SETTLE, message_id, segment)
        if self.counts:
            self.counts.pop(message_id, None)
        self.acquired.discard(message_id)

    def settle_all(self, ids: list[int], segments: list[int]) -> None:
        """:meth:`settle` for each of ``ids``, in order (of ``segments``)."""
        self._extend(RecordType.SETTLE, ids, segments)
        counts = self.counts
        if counts:
            for message_id in ids:
                counts.pop(message_id, None)
        self.acquired.difference_update(ids)

    def count(self, message_id: int, segment: int, delivery_count: int) -> None:
        """The message's failed-delivery count is now ``delivery_count``; it is back in its
        queue (a count record ends an acquisition, also at recovery)."""
        self.counts[message_id] = delivery_count
        self._add(RecordType.DELIVERY_COUNTS, message_id, segment)
        self.acquired.discard(message_id)

    def snapshot(self) -> list[bytes]:
        """Records of every live message's count, then of the messages consumers hold, for
        the start of a segment (in that order: replaying a count ends an acquisition)."""
        counts = list(self.counts.items())
        held = sorted(self.acquired)
        return [
            encode_delivery_counts(counts[start : start + _IDS_PER_RECORD])
            for start in range(0, len(counts), _IDS_PER_RECORD)
        ] + [
            encode_messages_changed(RecordType.ACQUIRE, held[start : start + _IDS_PER_RECORD])
            for start in range(0, len(held), _IDS_PER_RECORD)
        ]

    def place(self, placement: Placement, ledger: SegmentLedger) -> None:
        """Encode the buffered changes, one record a run, in order."""
        runs = self.buffer
        if not runs:
            return
        self.buffer = []
        for run in runs:
            kind = run.kind
            if kind is RecordType.DELIVERY_COUNTS:
                counts = self.counts
                pairs = [(i, counts[i]) for i in run.ids if i in counts]
                if pairs:
                    placement.append([encode_delivery_counts(pairs)])
                continue
            segment, _ = placement.append([encode_messages_changed(kind, run.ids)])
            if kind is RecordType.SETTLE:
                for message_segment, settled in Counter(run.segments).items():
                    ledger.settled(message_segment, segment, settled)
