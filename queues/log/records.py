"""The log's records: a length, a CRC-32 and a type byte in front of each body.

Layout of one record (big-endian)::

    u32 length of (type + body) | u32 CRC-32 of (type + body) | u8 type | body

The CRC covers the type byte, so a torn or overwritten record never decodes as another type.
Message ids are u64s the store hands out in log order; queue names are UTF-8 with a u16 length;
queue, exchange and binding arguments are AMQP maps (the codec of the message sections).

Record types are never redefined: a record that gains fields gets a new type, and the old one
stays readable, so a log written by an older server recovers (its missing fields take the values
that server implied: no routing, an exchange neither auto-delete nor internal, since it logged
no such exchange, bindings identified without their arguments).
"""

from __future__ import annotations

import enum
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import Final, TypeAlias

from sluicegate.wire.amqp_types import Value
from sluicegate.wire.encoding import encode

RECORD_HEAD = struct.Struct(">IIB")
HEADER_SIZE: Final = RECORD_HEAD.size
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
# Ids are big-endian u64s: an array of this machine's "Q" is swapped to them where it is not.
_LITTLE_ENDIAN: Final = sys.byteorder == "little"
assert array("Q").itemsize == 8
U64 = struct.Struct(">Q")
# An enqueue record's type and fixed fields (id, time, expiry), and a record's length and CRC.
_ENQUEUE = struct.Struct(">BQQQ")
_RECORD_HEAD = struct.Struct(">II")
# An enqueue record's fixed fields and its queue name's length.
ENQUEUE_FIELDS = struct.Struct(">QQQH")
# Where a shared body lies: segment, offset of its bytes, length.
BODY_REF = struct.Struct(">QQI")
# A message id and its failed-delivery count.
COUNT_FIELDS = struct.Struct(">QI")
# A record longer than this is corruption, not data: messages are capped far below it
# (max_message_size), and a flipped bit in a length must not make the reader allocate gigabytes.
MAX_RECORD_SIZE: Final = 1 << 30


class RecordType(enum.IntEnum):
    """What a record says; the numbers are the on-disk type byte and never change."""

    SEGMENT = 1
    DECLARE_QUEUE = 2
    DELETE_QUEUE = 3
    DECLARE_EXCHANGE = 4
    DELETE_EXCHANGE = 5
    BIND = 6
    UNBIND = 7
    ENQUEUE = 8
    SETTLE = 9
    ACQUIRE = 10
    RETURN = 11
    RETURN_FAILED = 12
    # ENQUEUE with the exchange and routing key the message was published with.
    ENQUEUE_ROUTED = 13
    # DECLARE_EXCHANGE with its flags (auto-delete, internal).
    DECLARE_EXCHANGE_FLAGS = 14
    # BIND and UNBIND to a queue or an exchange, the binding identified by its arguments too.
    BIND_DESTINATION = 15
    UNBIND_DESTINATION = 16
    # SEGMENT with the older segments still on disk when it was opened: a missing one is seen.
    SEGMENT_LIVE = 17
    # Segments compaction deletes once the batch holding this record is durable.
    SEGMENTS_DELETED = 18
    # ENQUEUE_ROUTED whose body is another enqueue record's (segment, offset, length).
    ENQUEUE_SHARED = 19
    # Absolute failed-delivery counts of messages, superseding earlier RETURN_FAILED records.
    DELIVERY_COUNTS = 20
    # The last record of a segment the writer moved past.
    SEGMENT_END = 21
    # SEGMENT_LIVE whose previous segment ends with SEGMENT_END: one cut short at a record
    # boundary, which no record's CRC can show, is seen.
    SEGMENT_AFTER_END = 22
    # A durable stream that retention or a purge emptied: the offset its next message gets,
    # which its messages no longer say after a restart.
    STREAM_OFFSET = 23


KINDS: Final = {kind.value: kind for kind in RecordType}

# The flags byte of DECLARE_EXCHANGE_FLAGS; the other bits must be zero.
AUTO_DELETE: Final = 0x01
INTERNAL: Final = 0x02
# The destination byte of BIND_DESTINATION and UNBIND_DESTINATION.
TO_QUEUE: Final = 0
TO_EXCHANGE: Final = 1


Arguments: TypeAlias = dict[str, Value]


@dataclass(frozen=True, slots=True)
class SegmentStart:
    """The first record of every segment: its number and the next message id at its start.

    ``older`` lists the segments on disk when it was opened (None in a type-1 record, which
    did not say), so that recovery notices one that went missing; ``after_end`` says the
    segment before it ends with its :class:`SegmentEnd` (a type-22 record).
    """

    segment: int
    next_id: int
    older: tuple[int, ...] | None = None
    after_end: bool = False


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """The record that closes a segment before the next one opens (docs/durability.md)."""

    segment: int


@dataclass(frozen=True, slots=True)
class SegmentsDeleted:
    """Segments compaction deletes after the batch holding this record is durable."""

    segments: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeliveryCounts:
    """Failed-delivery counts of messages: ``(message id, count)``, the latest one holds."""

    counts: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    """A durable queue and its arguments (``x-queue-type`` and the rest, as declared)."""

    name: str
    arguments: Arguments


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """A durable stream emptied: its next message gets ``offset`` (its offsets only grow)."""

    name: str
    offset: int


@dataclass(frozen=True, slots=True)
class QueueDeleted:
    """A queue and every message in it are gone."""

    name: str


@dataclass(frozen=True, slots=True)
class ExchangeDeclared:
    """A durable exchange of a type (``direct``, ``fanout``, ``topic``) and its flags."""

    name: str
    kind: str
    arguments: Arguments
    auto_delete: bool = False
    internal: bool = False


@dataclass(frozen=True, slots=True)
class ExchangeDeleted:
    """An exchange and its bindings are gone."""

    name: str


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding from an exchange to a queue or an exchange (``bound``) or its removal.

    A binding is identified by its ends, its key and its arguments. Records of types 6 and 7
    (``by_key``) identified it by its ends and key alone: a BIND of those replaced a binding
    with the same ends and key, an UNBIND removed it whatever its arguments.
    """

    exchange: str
    destination: str
    key: str
    arguments: Arguments
    bound: bool
    to_exchange: bool = False
    by_key: bool = False


@dataclass(slots=True)
class Enqueued:
    """A persistent message: its id, queue, arrival time and where its bytes lie in the record.

    ``payload_offset`` is relative to the start of the record, so the store can read the body
    back with one ``pread`` without decoding anything else. Read, never changed; not frozen:
    one is decoded per message paged in or recovered, and a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``, several times the cost.
    """

    message_id: int
    queue: str
    timestamp: int
    # Absolute expiry in milliseconds since the epoch (TTL or absolute-expiry-time), or None.
    expires: int | None
    payload_offset: int
    payload: bytes | memoryview
    # How it was published, for dead-lettering by routing key ("" in a format-1 record).
    exchange: str = ""
    routing_key: str = ""
    # Where the body lies when another enqueue record holds it (ENQUEUE_SHARED): segment and
    # offset of the body's bytes; None when the body is ``payload``.
    body_segment: int | None = None
    body_offset: int = 0
    body_length: int = 0

    @property
    def size(self) -> int:
        """The body's length, wherever it lies."""
        return len(self.payload) if self.body_segment is None else self.body_length


@dataclass(frozen=True, slots=True)
class MessagesChanged:
    """Settled (archived), acquired by a consumer, or returned (released, maybe failed)."""

    kind: RecordType
    message_ids: tuple[int, ...]


Record: TypeAlias = (
    SegmentStart
    | SegmentEnd
    | SegmentsDeleted
    | DeliveryCounts
    | QueueDeclared
    | QueueDeleted
    | StreamOffset
    | ExchangeDeclared
    | ExchangeDeleted
    | Binding
    | Enqueued
    | MessagesChanged
)


# -- encoding -----------------------------------------------------------------------------


def frame_record(kind: RecordType, body: bytes) -> bytes:
    """A record of ``kind`` with its length and CRC: what every encoder returns."""
    typed = bytes((kind,)) + body
    return U32.pack(len(typed)) + U32.pack(zlib.crc32(typed)) + typed


def _name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("a name longer than 65535 bytes cannot be logged")
    return U16.pack(len(raw)) + raw


def _long_name(name: str) -> bytes:
    # A routing key comes from a message's subject and the exchange a message names need not be
    # durable (so never logged as a name), so only the message size bounds them.
    raw = name.encode("utf-8")
    return U32.pack(len(raw)) + raw


def _arguments(arguments: Arguments) -> bytes:
    mapping: dict[Value, Value] = dict(arguments.items())
    return encode(mapping)


def _ids(values: tuple[int, ...] | list[int]) -> bytes:
    # An array packs a settlement's 100,000 ids in half the time struct.pack takes for them.
    packed = array("Q", values)
    if _LITTLE_ENDIAN:
        packed.byteswap()
    return U32.pack(len(values)) + packed.tobytes()


def encode_segment_start(segment: int, next_id: int, older: list[int]) -> bytes:
    """The record that opens a segment, naming the ``older`` segments still on disk; the one
    before it ends with :func:`encode_segment_end` (or there is none)."""
    body = U64.pack(segment) + U64.pack(next_id) + _ids(older)
    return frame_record(RecordType.SEGMENT_AFTER_END, body)


def encode_segment_end(segment: int) -> bytes:
    """The record that closes ``segment``: nothing is written to it after this."""
    return frame_record(RecordType.SEGMENT_END, U64.pack(segment))


def encode_segments_deleted(segments: list[int]) -> bytes:
    """Segments about to be deleted by compaction."""
    return frame_record(RecordType.SEGMENTS_DELETED, _ids(segments))


def encode_delivery_counts(counts: list[tuple[int, int]]) -> bytes:
    """Failed-delivery counts, ``(message id, count)`` pairs."""
    body = U32.pack(len(counts)) + b"".join(COUNT_FIELDS.pack(i, c) for i, c in counts)
    return frame_record(RecordType.DELIVERY_COUNTS, body)


def encode_queue_declared(name: str, arguments: Arguments) -> bytes:
    """A durable queue declaration."""
    return frame_record(RecordType.DECLARE_QUEUE, _name(name) + _arguments(arguments))


def encode_queue_deleted(name: str) -> bytes:
    """A queue deletion."""
    return frame_record(RecordType.DELETE_QUEUE, _name(name))


def encode_stream_offset(name: str, offset: int) -> bytes:
    """A durable stream emptied at ``offset``."""
    return frame_record(RecordType.STREAM_OFFSET, _name(name) + U64.pack(offset))


def encode_exchange_declared(
    name: str,
    kind: str,
    arguments: Arguments,
    *,
    auto_delete: bool = False,
    internal: bool = False,
) -> bytes:
    """A durable exchange declaration with its flags."""
    flags = (AUTO_DELETE if auto_delete else 0) | (INTERNAL if internal else 0)
    return frame_record(
        RecordType.DECLARE_EXCHANGE_FLAGS,
        _name(name) + _name(kind) + bytes((flags,)) + _arguments(arguments),
    )


def encode_exchange_deleted(name: str) -> bytes:
    """An exchange deletion."""
    return frame_record(RecordType.DELETE_EXCHANGE, _name(name))


def encode_binding(
    exchange: str,
    destination: str,
    key: str,
    arguments: Arguments,
    bound: bool,
    *,
    to_exchange: bool = False,
) -> bytes:
    """A binding to a queue (or ``to_exchange``, to an exchange) added (``bound``) or removed."""
    kind = RecordType.BIND_DESTINATION if bound else RecordType.UNBIND_DESTINATION
    ends = _name(exchange) + bytes((TO_EXCHANGE if to_exchange else TO_QUEUE,))
    return frame_record(kind, ends + _name(destination) + _name(key) + _arguments(arguments))


def enqueue_prefix(
    message_id: int,
    queue: str,
    timestamp: int,
    payload: bytes,
    expires: int | None = None,
    *,
    exchange: str = "",
    routing_key: str = "",
) -> bytes:
    """Everything of an enqueue record before its payload, so the payload is never copied.

    The record is this prefix followed by ``payload``: write both with one ``pwritev``.
    The exchange and routing key are logged rather than read back from the payload's
    ``x-exchange``/``x-routing-key`` annotations: those are the publisher's own when it sent a
    message-annotations section, and reading them would decode a section of every message.
    """
    body_head = _enqueue_head(
        RecordType.ENQUEUE_ROUTED, message_id, queue, timestamp, expires, exchange, routing_key
    )
    length = len(body_head) + len(payload)
    crc = zlib.crc32(payload, zlib.crc32(body_head))
    return _RECORD_HEAD.pack(length, crc) + body_head


def encode_enqueue_shared(
    message_id: int,
    queue: str,
    timestamp: int,
    body: tuple[int, int, int],
    expires: int | None = None,
    *,
    exchange: str = "",
    routing_key: str = "",
) -> bytes:
    """An enqueue whose body is the BODY record at ``body``: (segment, offset, length)."""
    head = _enqueue_head(
        RecordType.ENQUEUE_SHARED, message_id, queue, timestamp, expires, exchange, routing_key
    )
    typed = head + BODY_REF.pack(*body)
    return U32.pack(len(typed)) + U32.pack(zlib.crc32(typed)) + typed


def _enqueue_head(
    kind: RecordType,
    message_id: int,
    queue: str,
    timestamp: int,
    expires: int | None,
    exchange: str,
    routing_key: str,
) -> bytes:
    # Expiry is stored plus one, so that 0 means none.
    stored_expiry = 0 if expires is None else expires + 1
    key = (queue, exchange, routing_key)
    names = _ENQUEUE_NAMES.get(key)
    if names is None:
        names = _name(queue) + _long_name(exchange) + _long_name(routing_key)
        if len(names) <= _ENQUEUE_NAMES_SIZE:
            if len(_ENQUEUE_NAMES) >= _ENQUEUE_NAMES_MAX:
                _ENQUEUE_NAMES.clear()
            _ENQUEUE_NAMES[key] = names
    return _ENQUEUE.pack(kind, message_id, timestamp, stored_expiry) + names


# The encoded queue, exchange and routing key of enqueue records, by the three names: a queue's
# messages come through few exchanges and keys, and encoding the three per message cost a third
# of the record's head. Only short ones are kept, in a bounded table a publisher varying its
# routing key per message empties now and then.
_ENQUEUE_NAMES: Final[dict[tuple[str, str, str], bytes]] = {}
_ENQUEUE_NAMES_MAX: Final = 4096
_ENQUEUE_NAMES_SIZE: Final = 512


def encode_messages_changed(kind: RecordType, message_ids: list[int]) -> bytes:
    """A batch of settlements, acquisitions or returns."""
    return frame_record(kind, _ids(message_ids))
