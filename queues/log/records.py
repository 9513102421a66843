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
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, TypeAlias

from sluicegate.wire.codec import Value, decode, encode
from sluicegate.wire.errors import DecodeError

_HEAD = struct.Struct(">IIB")
HEADER_SIZE: Final = _HEAD.size
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ENQUEUE = struct.Struct(">QQQ")
# An enqueue record's fixed fields and its queue name's length.
_ENQUEUE_HEAD = struct.Struct(">QQQH")
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


_KINDS: Final = {kind.value: kind for kind in RecordType}

# The flags byte of DECLARE_EXCHANGE_FLAGS; the other bits must be zero.
_AUTO_DELETE: Final = 0x01
_INTERNAL: Final = 0x02
# The destination byte of BIND_DESTINATION and UNBIND_DESTINATION.
_TO_QUEUE: Final = 0
_TO_EXCHANGE: Final = 1


Arguments: TypeAlias = dict[str, Value]


@dataclass(frozen=True, slots=True)
class SegmentStart:
    """The first record of every segment: its number and the next message id at its start."""

    segment: int
    next_id: int


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    """A durable queue and its arguments (``x-queue-type`` and the rest, as declared)."""

    name: str
    arguments: Arguments


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


@dataclass(frozen=True, slots=True)
class Enqueued:
    """A persistent message: its id, queue, arrival time and where its bytes lie in the record.

    ``payload_offset`` is relative to the start of the record, so the store can read the body
    back with one ``pread`` without decoding anything else.
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


@dataclass(frozen=True, slots=True)
class MessagesChanged:
    """Settled (archived), acquired by a consumer, or returned (released, maybe failed)."""

    kind: RecordType
    message_ids: tuple[int, ...]


Record: TypeAlias = (
    SegmentStart
    | QueueDeclared
    | QueueDeleted
    | ExchangeDeclared
    | ExchangeDeleted
    | Binding
    | Enqueued
    | MessagesChanged
)


class TornRecord(DecodeError):
    """The buffer ends inside a record: a write that a crash cut short."""


class CorruptRecord(DecodeError):
    """A complete record whose CRC, type or body is wrong."""


# -- encoding -----------------------------------------------------------------------------


def _frame(kind: RecordType, body: bytes) -> bytes:
    typed = bytes((kind,)) + body
    return _U32.pack(len(typed)) + _U32.pack(zlib.crc32(typed)) + typed


def _name(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("a name longer than 65535 bytes cannot be logged")
    return _U16.pack(len(raw)) + raw


def _long_name(name: str) -> bytes:
    # A routing key comes from a message's subject and the exchange a message names need not be
    # durable (so never logged as a name), so only the message size bounds them.
    raw = name.encode("utf-8")
    return _U32.pack(len(raw)) + raw


def _arguments(arguments: Arguments) -> bytes:
    mapping: dict[Value, Value] = dict(arguments.items())
    return encode(mapping)


def encode_segment_start(segment: int, next_id: int) -> bytes:
    """The record that opens a segment."""
    return _frame(RecordType.SEGMENT, _U64.pack(segment) + _U64.pack(next_id))


def encode_queue_declared(name: str, arguments: Arguments) -> bytes:
    """A durable queue declaration."""
    return _frame(RecordType.DECLARE_QUEUE, _name(name) + _arguments(arguments))


def encode_queue_deleted(name: str) -> bytes:
    """A queue deletion."""
    return _frame(RecordType.DELETE_QUEUE, _name(name))


def encode_exchange_declared(
    name: str,
    kind: str,
    arguments: Arguments,
    *,
    auto_delete: bool = False,
    internal: bool = False,
) -> bytes:
    """A durable exchange declaration with its flags."""
    flags = (_AUTO_DELETE if auto_delete else 0) | (_INTERNAL if internal else 0)
    return _frame(
        RecordType.DECLARE_EXCHANGE_FLAGS,
        _name(name) + _name(kind) + bytes((flags,)) + _arguments(arguments),
    )


def encode_exchange_deleted(name: str) -> bytes:
    """An exchange deletion."""
    return _frame(RecordType.DELETE_EXCHANGE, _name(name))


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
    ends = _name(exchange) + bytes((_TO_EXCHANGE if to_exchange else _TO_QUEUE,))
    return _frame(kind, ends + _name(destination) + _name(key) + _arguments(arguments))


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
    # Expiry is stored plus one, so that 0 means none.
    stored_expiry = 0 if expires is None else expires + 1
    body_head = (
        bytes((RecordType.ENQUEUE_ROUTED,))
        + _ENQUEUE.pack(message_id, timestamp, stored_expiry)
        + _name(queue)
        + _long_name(exchange)
        + _long_name(routing_key)
    )
    length = len(body_head) + len(payload)
    crc = zlib.crc32(payload, zlib.crc32(body_head))
    return _U32.pack(length) + _U32.pack(crc) + body_head


def encode_messages_changed(kind: RecordType, message_ids: list[int]) -> bytes:
    """A batch of settlements, acquisitions or returns."""
    body = _U32.pack(len(message_ids)) + struct.pack(f">{len(message_ids)}Q", *message_ids)
    return _frame(kind, body)


# -- decoding -----------------------------------------------------------------------------


class _Body:
    """A cursor over one record body that reports overruns as corruption."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def take(self, size: int) -> memoryview:
        if self.pos + size > self.end:
            raise CorruptRecord("a field runs past the end of its record")
        chunk = self.buf[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def u64(self) -> int:
        value: int = _U64.unpack(self.take(8))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def name(self) -> str:
        size: int = _U16.unpack(self.take(2))[0]
        return self._utf8(size)

    def long_name(self) -> str:
        return self._utf8(self.u32())

    def _utf8(self, size: int) -> str:
        try:
            return bytes(self.take(size)).decode("utf-8")
        except UnicodeDecodeError as error:
            raise CorruptRecord("a name is not valid UTF-8") from error

    def arguments(self) -> Arguments:
        try:
            value, end = decode(self.buf[: self.end], self.pos)
        except DecodeError as error:
            raise CorruptRecord(f"bad arguments: {error}") from error
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise CorruptRecord("arguments are not a map with string keys")
        self.pos = end
        return {str(k): v for k, v in value.items()}

    def done(self) -> None:
        if self.pos != self.end:
            raise CorruptRecord("a record has bytes after its last field")


def _decode_body(kind: RecordType, body: _Body, start: int) -> Record:
    if kind is RecordType.SEGMENT:
        segment_start = SegmentStart(body.u64(), body.u64())
        body.done()
        return segment_start
    if kind in (RecordType.SETTLE, RecordType.ACQUIRE, RecordType.RETURN, RecordType.RETURN_FAILED):
        count = body.u32()
        ids = struct.unpack(f">{count}Q", body.take(8 * count))
        body.done()
        return MessagesChanged(kind, ids)
    record: Record
    if kind is RecordType.DECLARE_QUEUE:
        record = QueueDeclared(body.name(), body.arguments())
    elif kind is RecordType.DELETE_QUEUE:
        record = QueueDeleted(body.name())
    elif kind is RecordType.DECLARE_EXCHANGE:
        record = ExchangeDeclared(body.name(), body.name(), body.arguments())
    elif kind is RecordType.DECLARE_EXCHANGE_FLAGS:
        name, exchange_kind = body.name(), body.name()
        flags = body.take(1)[0]
        if flags & ~(_AUTO_DELETE | _INTERNAL):
            raise CorruptRecord(f"unknown exchange flags {flags:#04x}")
        record = ExchangeDeclared(
            name,
            exchange_kind,
            body.arguments(),
            auto_delete=bool(flags & _AUTO_DELETE),
            internal=bool(flags & _INTERNAL),
        )
    elif kind is RecordType.DELETE_EXCHANGE:
        record = ExchangeDeleted(body.name())
    elif kind is RecordType.BIND or kind is RecordType.UNBIND:
        exchange, queue, key = body.name(), body.name(), body.name()
        bound = kind is RecordType.BIND
        record = Binding(exchange, queue, key, body.arguments(), bound, by_key=True)
    else:
        exchange = body.name()
        destination_kind = body.take(1)[0]
        if destination_kind not in (_TO_QUEUE, _TO_EXCHANGE):
            raise CorruptRecord(f"unknown binding destination {destination_kind}")
        destination, key = body.name(), body.name()
        bound = kind is RecordType.BIND_DESTINATION
        to_exchange = destination_kind == _TO_EXCHANGE
        record = Binding(exchange, destination, key, body.arguments(), bound, to_exchange)
    body.done()
    return record


def decode_record(buf: bytes | memoryview, pos: int) -> tuple[Record, int]:
    """Decode the record at ``pos``; return it and the offset just past it.

    Raises :class:`TornRecord` when ``buf`` ends inside the record and :class:`CorruptRecord`
    when the record is complete but wrong.
    """
    view = memoryview(buf)
    if pos + HEADER_SIZE > len(view):
        raise TornRecord("the buffer ends inside a record header")
    length, crc, type_byte = _HEAD.unpack_from(view, pos)
    if length == 0 or length > MAX_RECORD_SIZE:
        raise CorruptRecord(f"impossible record length {length}")
    end = pos + 8 + length
    if end > len(view):
        raise TornRecord("the buffer ends inside a record")
    if zlib.crc32(view[pos + 8 : end]) != crc:
        raise CorruptRecord("CRC mismatch")
    kind = _KINDS.get(type_byte)
    if kind is None:
        raise CorruptRecord(f"unknown record type {type_byte}")
    if kind is RecordType.ENQUEUE_ROUTED or kind is RecordType.ENQUEUE:
        return _decode_enqueue(kind, view, pos, end), end
    return _decode_body(kind, _Body(view, pos + HEADER_SIZE, end), pos), end


def _decode_enqueue(kind: RecordType, view: memoryview, start: int, end: int) -> Enqueued:
    """The most frequent record, decoded without a cursor: recovery reads millions of them."""
    pos = start + HEADER_SIZE
    if pos + _ENQUEUE_HEAD.size > end:
        raise CorruptRecord("a field runs past the end of its record")
    message_id, timestamp, stored_expiry, size = _ENQUEUE_HEAD.unpack_from(view, pos)
    pos += _ENQUEUE_HEAD.size
    queue, pos = _utf8_at(view, pos, size, end)
    exchange = routing_key = ""
    if kind is RecordType.ENQUEUE_ROUTED:
        exchange, pos = _utf8_at(view, pos + 4, _u32_at(view, pos, end), end)
        routing_key, pos = _utf8_at(view, pos + 4, _u32_at(view, pos, end), end)
    expires = stored_expiry - 1 if stored_expiry else None
    return Enqueued(
        message_id, queue, timestamp, expires, pos - start, view[pos:end], exchange, routing_key
    )


def _u32_at(view: memoryview, pos: int, end: int) -> int:
    if pos + 4 > end:
        raise CorruptRecord("a field runs past the end of its record")
    value: int = _U32.unpack_from(view, pos)[0]
    return value


def _utf8_at(view: memoryview, pos: int, size: int, end: int) -> tuple[str, int]:
    stop = pos + size
    if stop > end:
        raise CorruptRecord("a field runs past the end of its record")
    try:
        return str(view[pos:stop], "utf-8"), stop
    except UnicodeDecodeError as error:
        raise CorruptRecord("a name is not valid UTF-8") from error


def iter_records(buf: bytes | memoryview, pos: int = 0) -> Iterator[tuple[int, Record]]:
    """Yield ``(offset, record)`` for each record from ``pos`` to the end of ``buf``."""
    while pos < len(buf):
        record, end = decode_record(buf, pos)
        yield pos, record
        pos = end
