"""Replaying the log after a crash or a restart: records in, the server's durable state out.

Pure: segments arrive as bytes. Unreadable bytes are recorded as :class:`Damage`, the segment
replayed up to them; :meth:`Recovery.finish` adds the segments missing from the sequence and
a log shorter than a clean shutdown left it. Only a torn tail (the last segment's end, nothing
valid after it) is what a crash leaves; the store cuts it and refuses everything else
(:mod:`queues.log.damage`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from typing import Final, NamedTuple

from sluicegate.queues.log.damage import Damage, records_after, valid_run
from sluicegate.queues.log.decoding import TornRecord, decode_record
from sluicegate.queues.log.ledger import SegmentLedger
from sluicegate.queues.log.paged import PageEntries
from sluicegate.queues.log.records import (
    Arguments,
    Binding,
    DeliveryCounts,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    MessagesChanged,
    QueueDeclared,
    QueueDeleted,
    Record,
    RecordType,
    SegmentEnd,
    SegmentsDeleted,
    SegmentStart,
    StreamOffset,
)
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.encoding import encode_canonical
from sluicegate.wire.errors import DecodeError


class LogCorrupted(Exception):
    """A record is not what the log said it would be: the log cannot be read on safely."""

    def __init__(self, segment: int, offset: int, reason: str) -> None:
        super().__init__(f"segment {segment} is corrupt at offset {offset}: {reason}")
        self.segment = segment
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CleanShutdown:
    """Where a clean shutdown left the log's end: its last segment and that segment's length."""

    segment: int
    length: int


# What recovery knows of a message id: nothing (not enqueued in a live queue), live, or gone.
_UNSEEN: Final = 0
_LIVE: Final = 1
_GONE: Final = 2


class RecoveredPage(PageEntries):
    """A page as replay builds it, with each message's payload size for its queue's byte count.

    Settled messages stay in it (their state says so) until the store turns it into a
    :class:`~queues.log.paged.DiskPage` of the live ones.
    """

    __slots__ = ("sizes",)

    def __init__(self, segment: int, start: int, first_id: int, first_timestamp: int) -> None:
        super().__init__(segment, start, first_id, first_timestamp)
        self.sizes = array("I")

    def add(self, offset: int, end: int, message_id: int, size: int, timestamp: int) -> None:
        """Append an enqueued message."""
        self._append(offset, end, message_id, timestamp)
        self.sizes.append(size)


class MessageStates:
    """Whether each message the log enqueued is live: one byte per id, segment by segment.

    A backlog of millions of small messages must recover in a fraction of its size, so the
    messages themselves are only in their queues' pages (ten bytes each). Ids are handed out
    in log order, so the ids enqueued in a segment are a range that starts at its header's
    ``next_id`` less one (the enqueue that rolled into the segment took its id first) and
    ends where the next segment's starts: a settle record finds its message's segment by
    binary search. Acquisitions and failed deliveries, few, are kept by id.
    """

    __slots__ = ("_bases", "_first", "_numbers", "_states", "acquired", "failures")

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._numbers: list[int] = []
        self._first: dict[int, int] = {}
        self._states: dict[int, bytearray] = {}
        # Held by a consumer when the log ended: its settlement, if any, never became durable.
        self.acquired: set[int] = set()
        # Deliveries that ended as failures (modified with delivery-failed, or a consumer lost).
        self.failures: dict[int, int] = {}

    def open_segment(self, segment: int, next_id: int) -> None:
        """A segment starts, its header saying the next id the store would hand out."""
        first = next_id - 1
        self._bases.append(first)
        self._numbers.append(segment)
        self._first[segment] = first
        self._states[segment] = bytearray()

    def enqueued(self, segment: int, message_id: int) -> bool:
        """A message of a live queue was enqueued in ``segment``; False if its id cannot be."""
        # Replay enqueues only into the segment it opened last.
        if not self._numbers or segment != self._numbers[-1]:
            return False
        slot = message_id - self._bases[-1]
        if slot < 0:
            return False
        states = self._states[segment]
        if slot >= len(states):
            # Grown in steps, not per message: ids beyond the last one stay unseen.
            states.extend(bytes(slot + 1 - len(states) + len(states) // 4 + 4096))
        states[slot] = _LIVE
        return True

    def find(self, message_id: int) -> int | None:
        """The segment of a live message."""
        index = bisect_right(self._bases, message_id) - 1
        while index >= 0:
            segment = self._numbers[index]
            slot = message_id - self._bases[index]
            states = self._states[segment]
            state = states[slot] if slot < len(states) else _UNSEEN
            if state != _UNSEEN:
                return segment if state == _LIVE else None
            if slot > 0:
                return None
            # A segment's first id may be the previous segment's last one.
            index -= 1
        return None

    def live(self, segment: int, message_id: int) -> bool:
        """True if the message enqueued in ``segment`` is not settled."""
        slot = message_id - self._first[segment]
        states = self._states[segment]
        return 0 <= slot < len(states) and states[slot] == _LIVE

    def settled_in(self, page: PageEntries) -> list[int]:
        """The indices in ``page`` of the messages that are not live, in order."""
        first = self._first[page.segment]
        states = self._states[page.segment]
        offset = page.first_id - first
        return [index for index, delta in enumerate(page.ids) if states[offset + delta] != _LIVE]

    def settle(self, segment: int, message_id: int) -> None:
        """The message is settled: it will not be recovered."""
        self._states[segment][message_id - self._first[segment]] = _GONE
        self.acquired.discard(message_id)
        self.failures.pop(message_id, None)

    def delivery_count(self, message_id: int) -> int:
        """Failed delivery attempts, counting one the crash interrupted (AMQP §3.2.1)."""
        held = 1 if message_id in self.acquired else 0
        return self.failures.get(message_id, 0) + held


@dataclass(frozen=True, slots=True)
class ExchangeState:
    """A recovered exchange."""

    kind: str
    arguments: Arguments
    auto_delete: bool = False
    internal: bool = False


class BindingKey(NamedTuple):
    """What identifies a durable binding: its ends, its key and its arguments (canonical)."""

    exchange: str
    destination: str
    key: str
    to_exchange: bool
    arguments: bytes


def binding_key(
    exchange: str, destination: str, key: str, arguments: Arguments, *, to_exchange: bool = False
) -> BindingKey:
    """The key of a binding with these arguments."""
    mapping: dict[Value, Value] = dict(arguments.items())
    return BindingKey(exchange, destination, key, to_exchange, encode_canonical(mapping))


def without_exchange(bindings: dict[BindingKey, Arguments], name: str) -> None:
    """Drop the bindings of a deleted exchange: from it, and to it."""
    for key in [
        k for k in bindings if k.exchange == name or (k.to_exchange and k.destination == name)
    ]:
        del bindings[key]


def without_queue(bindings: dict[BindingKey, Arguments], name: str) -> None:
    """Drop the bindings to a deleted queue."""
    for key in [k for k in bindings if k.destination == name and not k.to_exchange]:
        del bindings[key]


@dataclass(slots=True)
class RecoveredState:
    """Everything durable, in declaration and log order."""

    queues: dict[str, Arguments] = field(default_factory=dict)
    exchanges: dict[str, ExchangeState] = field(default_factory=dict)
    bindings: dict[BindingKey, Arguments] = field(default_factory=dict)
    # The offset each durable stream emptied by retention or a purge went on from.
    stream_offsets: dict[str, int] = field(default_factory=dict)
    messages: MessageStates = field(default_factory=MessageStates)
    # Each declared queue's messages, in log order, settled ones included.
    backlogs: dict[str, list[RecoveredPage]] = field(default_factory=dict)
    next_id: int = 0
    # The bytes of each segment that hold valid records; the tail may have been cut shorter.
    valid_length: dict[int, int] = field(default_factory=dict)
    # Every segment's size on disk, and what is wrong with the log (nothing, or a torn tail).
    sizes: dict[int, int] = field(default_factory=dict)
    damages: list[Damage] = field(default_factory=list)
    # Valid records per segment, for reports.
    records: dict[int, int] = field(default_factory=dict)
    # Segments that end with their end record, and those that lack it though the segment
    # after them says they have it (cut short): the store closes these, and the last one.
    ended: set[int] = field(default_factory=set)
    unended: set[int] = field(default_factory=set)

    @property
    def torn_tail(self) -> Damage | None:
        """The damage a crash explains, if that is all there is."""
        damages = self.damages
        return damages[0] if len(damages) == 1 and damages[0].torn else None

    @property
    def refused(self) -> list[Damage]:
        """The damages no crash explains."""
        return [] if self.torn_tail is not None else list(self.damages)

    def later_segments(self) -> dict[int, int]:
        """For each segment, how many segments follow it."""
        numbers = sorted(self.sizes)
        return {number: len(numbers) - index - 1 for index, number in enumerate(numbers)}


class Recovery:
    """Feeds segments through the records' meaning, oldest first."""

    def __init__(self) -> None:
        self.state = RecoveredState()
        self.ledger = SegmentLedger()
        # The newest segment header read, and the deletions logged since: what must exist.
        self._header: SegmentStart | None = None
        self._deleted: set[int] = set()

    def segment(self, number: int, data: bytes | memoryview, last: bool) -> None:
        """Replay one segment's bytes; ``last`` says it is the tail the log was writing.

        Replay stops at the first unreadable record and records the damage: torn when the
        segment is the last and nothing valid follows.
        """
        self.ledger.open_segment(number)
        state = self.state
        pos = 0
        size = len(data)
        count = 0
        state.sizes[number] = size
        while pos < size:
            try:
                record, end = decode_record(data, pos)
                if pos == 0 and not (isinstance(record, SegmentStart) and record.segment == number):
                    raise LogCorrupted(number, 0, "the segment does not start with its own header")
                if number in state.ended:
                    raise LogCorrupted(number, pos, "a record follows the segment's end record")
                self.apply(number, pos, record)
            except TornRecord as error:
                self._damaged(number, pos, str(error), 0, size, last)
                break
            except DecodeError as error:
                self._damaged(number, pos, str(error), records_after(data, pos), size, last)
                break
            except LogCorrupted as error:
                self._damaged(number, pos, error.reason, valid_run(data, end), size, last=False)
                break
            pos = end
            count += 1
        if not count and not last and pos == size:
            # Shorter than its header: a segment the writer moved past was fsynced whole first.
            self._damaged(number, 0, "the segment has no header (it is empty)", 0, size, last)
        state.valid_length[number] = pos
        state.records[number] = count

    def oversized(self, number: int, size: int, limit: int) -> None:
        """A segment file too large to be one, not read: everything in it is in doubt."""
        self.ledger.open_segment(number)
        state = self.state
        state.sizes[number] = size
        state.valid_length[number] = 0
        state.records[number] = 0
        reason = f"the file is {size} bytes, more than any segment ({limit}); not read"
        state.damages.append(Damage(number, 0, reason, 0, size))

    def _damaged(
        self, number: int, pos: int, reason: str, following: int, size: int, last: bool
    ) -> None:
        torn = last and following == 0
        self.state.damages.append(Damage(number, pos, reason, following, size - pos, torn))

    def finish(
        self, present: list[int], clean: CleanShutdown | None, strays: list[str] | None = None
    ) -> None:
        """After the last segment: note the segments that should exist and do not, and the
        files named like segments that are not (``strays``: a copy or a misnamed segment,
        whatever it holds would be lost or replayed twice, so it is refused).

        The newest header names every older segment then on disk, less those compaction
        deleted since; a clean shutdown names the last segment and its length.
        """
        damages = self.state.damages
        for name in strays or ():
            reason = "named like a segment but not a segment name the server writes; not read"
            damages.append(Damage(-1, None, reason, file=name))
        header = self._header
        if header is not None and header.older is not None:
            on_disk = set(present)
            for missing in sorted(set(header.older) - on_disk - self._deleted):
                damages.append(
                    Damage(missing, None, f"missing (segment {header.segment} lists it)")
                )
        if clean is None:
            return
        # A clean shutdown leaves no torn tail: whatever is cut short was complete then.
        damages[:] = [replace(d, torn=False) for d in damages]
        size = self.state.sizes.get(clean.segment)
        if size is None:
            reason = f"missing (the last clean shutdown left it {clean.length} bytes long)"
            damages.append(Damage(clean.segment, None, reason))
        elif size != clean.length:
            reason = f"{size} bytes where the last clean shutdown left {clean.length}"
            at = min(size, clean.length)
            damages.append(Damage(clean.segment, at, reason, dropped_bytes=size - at))

    def apply(self, segment: int, offset: int, record: Record) -> None:
        """Apply one record found at ``offset`` in ``segment``."""
        state = self.state
        if isinstance(record, Enqueued):
            pages = state.backlogs.get(record.queue)
            if pages is None:
                return
            message_id = record.message_id
            if not state.messages.enqueued(segment, message_id):
                raise LogCorrupted(segment, offset, f"message id {message_id} is out of order")
            size = record.size
            if record.body_segment is None:
                end = offset + record.payload_offset + size
            else:
                end = offset + record.payload_offset
                self._check_body(segment, offset, record)
            if not pages or not pages[-1].fits(segment, end, message_id):
                pages.append(RecoveredPage(segment, offset, message_id, record.timestamp))
            pages[-1].add(offset, end, message_id, size, record.timestamp)
            self.ledger.enqueued(segment)
            state.next_id = max(state.next_id, message_id + 1)
        elif isinstance(record, MessagesChanged):
            self._changed(segment, record)
        elif isinstance(record, DeliveryCounts):
            messages = state.messages
            for message_id, count in record.counts:
                if messages.find(message_id) is not None:
                    messages.failures[message_id] = count
                    messages.acquired.discard(message_id)
        elif isinstance(record, SegmentEnd):
            if record.segment != segment:
                raise LogCorrupted(segment, offset, f"the end record of segment {record.segment}")
            state.ended.add(segment)
        elif isinstance(record, SegmentStart):
            if record.after_end:
                self._check_ended(segment - 1, segment)
            state.messages.open_segment(segment, record.next_id)
            state.next_id = max(state.next_id, record.next_id)
            self._header = record
            self._deleted = set()
        elif isinstance(record, SegmentsDeleted):
            self._deleted.update(record.segments)
        elif isinstance(record, QueueDeclared):
            state.queues[record.name] = record.arguments
            state.backlogs.setdefault(record.name, [])
        elif isinstance(record, QueueDeleted):
            self._delete_queue(segment, record.name)
        elif isinstance(record, StreamOffset):
            if record.name in state.queues:
                state.stream_offsets[record.name] = record.offset
        elif isinstance(record, ExchangeDeclared):
            state.exchanges[record.name] = ExchangeState(
                record.kind, record.arguments, record.auto_delete, record.internal
            )
        elif isinstance(record, ExchangeDeleted):
            state.exchanges.pop(record.name, None)
            without_exchange(state.bindings, record.name)
            self.ledger.topology_removed(segment)
        else:
            self._binding(segment, record)

    def _check_ended(self, previous: int, segment: int) -> None:
        """The segment before a type-22 header ends with its end record, if it is still here.

        Without one it was cut short, at a record boundary if no other damage says so:
        confirmed messages may have gone with its last records.
        """
        state = self.state
        if previous not in state.sizes or previous in state.ended:
            return
        state.unended.add(previous)
        if any(damage.segment == previous for damage in state.damages):
            return
        length = state.valid_length[previous]
        reason = f"no end record, though segment {segment} follows it: cut short"
        dropped = state.sizes[previous] - length
        state.damages.append(Damage(previous, length, reason, dropped_bytes=dropped))

    @staticmethod
    def _check_body(segment: int, offset: int, record: Enqueued) -> None:
        """A shared body lies before its reference in the same segment, which it keeps alive."""
        body_segment = record.body_segment
        if body_segment != segment or record.body_offset + record.body_length > offset:
            raise LogCorrupted(
                segment,
                offset,
                f"message {record.message_id} names a body at segment {body_segment} offset "
                f"{record.body_offset} that is not in the log",
            )

    def _changed(self, segment: int, record: MessagesChanged) -> None:
        kind = record.kind
        messages = self.state.messages
        ledger = self.ledger
        for message_id in record.message_ids:
            found = messages.find(message_id)
            if found is None:
                continue
            if kind is RecordType.SETTLE:
                messages.settle(found, message_id)
                ledger.settled(found, segment)
            elif kind is RecordType.ACQUIRE:
                messages.acquired.add(message_id)
            else:
                messages.acquired.discard(message_id)
                if kind is RecordType.RETURN_FAILED:
                    messages.failures[message_id] = messages.failures.get(message_id, 0) + 1

    def _delete_queue(self, segment: int, name: str) -> None:
        state = self.state
        state.queues.pop(name, None)
        state.stream_offsets.pop(name, None)
        messages = state.messages
        for page in state.backlogs.pop(name, ()):
            for message_id in page.message_ids():
                if messages.live(page.segment, message_id):
                    messages.settle(page.segment, message_id)
                    self.ledger.settled(page.segment, segment)
        without_queue(state.bindings, name)
        self.ledger.topology_removed(segment)

    def _binding(self, segment: int, record: Binding) -> None:
        bindings = self.state.bindings
        if record.by_key:
            for key in [
                k
                for k in bindings
                if (k.exchange, k.destination, k.key, k.to_exchange)
                == (record.exchange, record.destination, record.key, False)
            ]:
                del bindings[key]
        key = binding_key(
            record.exchange,
            record.destination,
            record.key,
            record.arguments,
            to_exchange=record.to_exchange,
        )
        if record.bound:
            bindings[key] = record.arguments
        else:
            bindings.pop(key, None)
            self.ledger.topology_removed(segment)
