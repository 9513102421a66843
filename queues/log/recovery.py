"""Replaying the log after a crash or a restart: records in, the server's durable state out.

Pure: segments arrive as bytes. The policy for bad bytes is the one a crash can explain:
a crash can only tear the end of the last segment (the writer fsyncs a segment before it
writes the next), so in the last segment the first torn or corrupt record and everything after
it are cut off (nothing there was ever confirmed, since a confirmed record is fsynced with all
bytes before it). A bad record in any earlier segment cannot come from a crash: recovery stops
with :class:`LogCorrupted` naming the segment and the offset, rather than silently dropping
messages that were confirmed.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple

from queues.codec import Value, encode_canonical
from queues.errors import DecodeError
from queues.log.ledger import SegmentLedger
from queues.log.records import (
    Arguments,
    Binding,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    MessagesChanged,
    QueueDeclared,
    QueueDeleted,
    Record,
    RecordType,
    SegmentStart,
    decode_record,
)


class LogCorrupted(Exception):
    """A record before the tail of the log is unreadable: recovery cannot go on safely."""

    def __init__(self, segment: int, offset: int, reason: str) -> None:
        super().__init__(f"segment {segment} is corrupt at offset {offset}: {reason}")
        self.segment = segment
        self.offset = offset


class RecoveredMessages:
    """Every message the log enqueued, compactly, in log order: ids increase with the index.

    A backlog of millions of small messages must recover in a fraction of its size: each
    message costs some forty bytes here (parallel arrays), and a settle record finds its
    message by binary search on the ids. Acquisitions and failed deliveries, rare, are kept
    by index in a set and a dict.
    """

    __slots__ = (
        "acquired",
        "ends",
        "failures",
        "ids",
        "live",
        "offsets",
        "segments",
        "sizes",
        "timestamps",
    )

    def __init__(self) -> None:
        self.ids = array("Q")
        self.segments = array("I")
        # Where each record starts and ends in its segment, and its payload's size.
        self.offsets = array("I")
        self.ends = array("I")
        self.sizes = array("I")
        self.timestamps = array("Q")
        self.live = bytearray()
        # Held by a consumer when the log ended: its settlement, if any, never became durable.
        self.acquired: set[int] = set()
        # Deliveries that ended as failures (modified with delivery-failed, or a consumer lost).
        self.failures: dict[int, int] = {}

    def add(
        self, message_id: int, segment: int, offset: int, end: int, size: int, timestamp: int
    ) -> int:
        """Record an enqueued message; return its index."""
        index = len(self.ids)
        self.ids.append(message_id)
        self.segments.append(segment)
        self.offsets.append(offset)
        self.ends.append(end)
        self.sizes.append(size)
        self.timestamps.append(timestamp)
        self.live.append(1)
        return index

    def find(self, message_id: int) -> int | None:
        """The index of a live message."""
        index = bisect_left(self.ids, message_id)
        if index < len(self.ids) and self.ids[index] == message_id and self.live[index]:
            return index
        return None

    def settle(self, index: int) -> None:
        """The message is settled: it will not be recovered."""
        self.live[index] = 0
        self.acquired.discard(index)
        self.failures.pop(index, None)

    def delivery_count(self, index: int) -> int:
        """Failed delivery attempts, counting one the crash interrupted (AMQP §3.2.1)."""
        return self.failures.get(index, 0) + (1 if index in self.acquired else 0)


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
    messages: RecoveredMessages = field(default_factory=RecoveredMessages)
    # Indices into ``messages`` of each declared queue's messages, in log order.
    backlogs: dict[str, array[int]] = field(default_factory=dict)
    next_id: int = 0
    # The bytes of each segment that hold valid records; the tail may have been cut shorter.
    valid_length: dict[int, int] = field(default_factory=dict)
    truncated: int = 0


class Recovery:
    """Feeds segments through the records' meaning, oldest first."""

    def __init__(self) -> None:
        self.state = RecoveredState()
        self.ledger = SegmentLedger()

    def segment(self, number: int, data: bytes | memoryview, last: bool) -> None:
        """Replay one segment's bytes; ``last`` says it is the tail the log was writing."""
        self.ledger.open_segment(number)
        pos = 0
        size = len(data)
        while pos < size:
            try:
                record, end = decode_record(data, pos)
            except DecodeError as error:
                if not last:
                    raise LogCorrupted(number, pos, str(error)) from error
                self.state.truncated = size - pos
                break
            if pos == 0 and not (isinstance(record, SegmentStart) and record.segment == number):
                raise LogCorrupted(number, 0, "the segment does not start with its own header")
            self.apply(number, pos, record)
            pos = end
        self.state.valid_length[number] = pos

    def apply(self, segment: int, offset: int, record: Record) -> None:
        """Apply one record found at ``offset`` in ``segment``."""
        state = self.state
        if isinstance(record, Enqueued):
            backlog = state.backlogs.get(record.queue)
            if backlog is None:
                return
            size = len(record.payload)
            end = offset + record.payload_offset + size
            backlog.append(
                state.messages.add(record.message_id, segment, offset, end, size, record.timestamp)
            )
            self.ledger.enqueued(segment)
            state.next_id = max(state.next_id, record.message_id + 1)
        elif isinstance(record, MessagesChanged):
            self._changed(segment, record)
        elif isinstance(record, SegmentStart):
            state.next_id = max(state.next_id, record.next_id)
        elif isinstance(record, QueueDeclared):
            state.queues[record.name] = record.arguments
            state.backlogs.setdefault(record.name, array("I"))
        elif isinstance(record, QueueDeleted):
            self._delete_queue(segment, record.name)
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

    def _changed(self, segment: int, record: MessagesChanged) -> None:
        kind = record.kind
        messages = self.state.messages
        ledger = self.ledger
        for message_id in record.message_ids:
            index = messages.find(message_id)
            if index is None:
                continue
            if kind is RecordType.SETTLE:
                messages.settle(index)
                ledger.settled(messages.segments[index], segment)
            elif kind is RecordType.ACQUIRE:
                messages.acquired.add(index)
            else:
                messages.acquired.discard(index)
                if kind is RecordType.RETURN_FAILED:
                    messages.failures[index] = messages.failures.get(index, 0) + 1

    def _delete_queue(self, segment: int, name: str) -> None:
        state = self.state
        state.queues.pop(name, None)
        messages = state.messages
        for index in state.backlogs.pop(name, ()):
            if messages.live[index]:
                messages.settle(index)
                self.ledger.settled(messages.segments[index], segment)
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
