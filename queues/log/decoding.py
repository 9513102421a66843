"""Reading the log's records back: each one checked by its CRC, its type and its fields.

A record is either whole and right, :class:`TornRecord` (the bytes end inside it: a write a crash
cut short) or :class:`CorruptRecord` (complete but wrong). The layout is in
:mod:`queues.log.records`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Final

from sluicegate.queues.log.records import (
    AUTO_DELETE,
    BODY_REF,
    COUNT_FIELDS,
    ENQUEUE_FIELDS,
    HEADER_SIZE,
    INTERNAL,
    KINDS,
    MAX_RECORD_SIZE,
    RECORD_HEAD,
    TO_EXCHANGE,
    TO_QUEUE,
    U16,
    U32,
    U64,
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
from sluicegate.wire.decoding import decode
from sluicegate.wire.errors import DecodeError


class TornRecord(DecodeError):
    """The buffer ends inside a record: a write that a crash cut short."""


class CorruptRecord(DecodeError):
    """A complete record whose CRC, type or body is wrong."""


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
        value: int = U64.unpack(self.take(8))[0]
        return value

    def u32(self) -> int:
        value: int = U32.unpack(self.take(4))[0]
        return value

    def ids(self) -> tuple[int, ...]:
        count = self.u32()
        ids: tuple[int, ...] = struct.unpack(f">{count}Q", self.take(8 * count))
        return ids

    def name(self) -> str:
        size: int = U16.unpack(self.take(2))[0]
        return self._utf8(size)

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


_CHANGES: Final = (
    RecordType.SETTLE,
    RecordType.ACQUIRE,
    RecordType.RETURN,
    RecordType.RETURN_FAILED,
)


def _decode_body(kind: RecordType, body: _Body) -> Record:
    record: Record
    if kind in _CHANGES:
        record = MessagesChanged(kind, body.ids())
    elif kind is RecordType.SEGMENT:
        record = SegmentStart(body.u64(), body.u64())
    elif kind is RecordType.SEGMENT_LIVE:
        record = SegmentStart(body.u64(), body.u64(), body.ids())
    elif kind is RecordType.SEGMENT_AFTER_END:
        record = SegmentStart(body.u64(), body.u64(), body.ids(), after_end=True)
    elif kind is RecordType.SEGMENT_END:
        record = SegmentEnd(body.u64())
    elif kind is RecordType.SEGMENTS_DELETED:
        record = SegmentsDeleted(body.ids())
    elif kind is RecordType.DELIVERY_COUNTS:
        count = body.u32()
        raw = body.take(COUNT_FIELDS.size * count)
        record = DeliveryCounts(tuple(COUNT_FIELDS.iter_unpack(raw)))
    elif kind is RecordType.DECLARE_QUEUE:
        record = QueueDeclared(body.name(), body.arguments())
    elif kind is RecordType.DELETE_QUEUE:
        record = QueueDeleted(body.name())
    elif kind is RecordType.STREAM_OFFSET:
        record = StreamOffset(body.name(), body.u64())
    elif kind is RecordType.DECLARE_EXCHANGE:
        record = ExchangeDeclared(body.name(), body.name(), body.arguments())
    elif kind is RecordType.DECLARE_EXCHANGE_FLAGS:
        name, exchange_kind = body.name(), body.name()
        flags = body.take(1)[0]
        if flags & ~(AUTO_DELETE | INTERNAL):
            raise CorruptRecord(f"unknown exchange flags {flags:#04x}")
        record = ExchangeDeclared(
            name,
            exchange_kind,
            body.arguments(),
            auto_delete=bool(flags & AUTO_DELETE),
            internal=bool(flags & INTERNAL),
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
        if destination_kind not in (TO_QUEUE, TO_EXCHANGE):
            raise CorruptRecord(f"unknown binding destination {destination_kind}")
        destination, key = body.name(), body.name()
        bound = kind is RecordType.BIND_DESTINATION
        to_exchange = destination_kind == TO_EXCHANGE
        record = Binding(exchange, destination, key, body.arguments(), bound, to_exchange)
    body.done()
    return record


def decode_record(buf: bytes | memoryview, pos: int) -> tuple[Record, int]:
    """Decode the record at ``pos``; return it and the offset just past it.

    Raises :class:`TornRecord` when ``buf`` ends inside the record and :class:`CorruptRecord`
    when the record is complete but wrong.
    """
    view = memoryview(buf)
    end, crc = _framed(view, pos)
    if zlib.crc32(view[pos + 8 : end]) != crc:
        raise CorruptRecord("CRC mismatch")
    return _typed(view, pos, end), end


def decode_fields(buf: bytes | memoryview, pos: int) -> tuple[Record, int, int]:
    """Decode the record at ``pos`` without checking its CRC: the record, its end and its CRC.

    For bytes that are likely no record at all (a search for records after damage): wrong
    fields are usually found without reading the whole length; :func:`crc_matches` finishes.
    """
    view = memoryview(buf)
    end, crc = _framed(view, pos)
    return _typed(view, pos, end), end, crc


def crc_matches(buf: bytes | memoryview, pos: int, end: int, crc: int) -> bool:
    """True if the record from ``pos`` to ``end`` has the CRC its header gives."""
    return zlib.crc32(memoryview(buf)[pos + 8 : end]) == crc


def _framed(view: memoryview, pos: int) -> tuple[int, int]:
    """The end of the record at ``pos`` and its CRC, from its header."""
    if pos + HEADER_SIZE > len(view):
        raise TornRecord("the buffer ends inside a record header")
    length, crc, _ = RECORD_HEAD.unpack_from(view, pos)
    if length == 0 or length > MAX_RECORD_SIZE:
        raise CorruptRecord(f"impossible record length {length}")
    end = pos + 8 + length
    if end > len(view):
        raise TornRecord("the buffer ends inside a record")
    return end, crc


def _typed(view: memoryview, pos: int, end: int) -> Record:
    """The record of its type byte, from its fields."""
    type_byte = view[pos + HEADER_SIZE - 1]
    kind = KINDS.get(type_byte)
    if kind is None:
        raise CorruptRecord(f"unknown record type {type_byte}")
    if kind in _ENQUEUES:
        return _decode_enqueue(kind, view, pos, end)
    return _decode_body(kind, _Body(view, pos + HEADER_SIZE, end))


_ENQUEUES: Final = (RecordType.ENQUEUE_ROUTED, RecordType.ENQUEUE, RecordType.ENQUEUE_SHARED)


def _decode_enqueue(kind: RecordType, view: memoryview, start: int, end: int) -> Enqueued:
    """The most frequent record, decoded without a cursor: recovery reads millions of them."""
    pos = start + HEADER_SIZE
    if pos + ENQUEUE_FIELDS.size > end:
        raise CorruptRecord("a field runs past the end of its record")
    message_id, timestamp, stored_expiry, size = ENQUEUE_FIELDS.unpack_from(view, pos)
    pos += ENQUEUE_FIELDS.size
    queue, pos = _utf8_at(view, pos, size, end)
    exchange = routing_key = ""
    if kind is not RecordType.ENQUEUE:
        exchange, pos = _utf8_at(view, pos + 4, _u32_at(view, pos, end), end)
        routing_key, pos = _utf8_at(view, pos + 4, _u32_at(view, pos, end), end)
    expires = stored_expiry - 1 if stored_expiry else None
    if kind is RecordType.ENQUEUE_SHARED:
        if pos + BODY_REF.size != end:
            raise CorruptRecord("a shared enqueue's body reference has the wrong size")
        segment, offset, length = BODY_REF.unpack_from(view, pos)
        return Enqueued(
            message_id,
            queue,
            timestamp,
            expires,
            end - start,
            b"",
            exchange,
            routing_key,
            segment,
            offset,
            length,
        )
    return Enqueued(
        message_id, queue, timestamp, expires, pos - start, view[pos:end], exchange, routing_key
    )


# An enqueue record's head up to its names: length, CRC, type, id, arrival, expiry plus one.
ENQUEUE_RECORD_HEAD: Final = struct.Struct(">IIBQQQ")
ROUTED: Final = RecordType.ENQUEUE_ROUTED.value


class RoutedRecords:
    """Routed enqueue records of one buffer read from the log, and the queue, exchange and
    routing key encoded as in the last one decoded in full.

    Those names are a run of length-prefixed fields, so a record whose bytes at the same place
    start with the same run names the same three: it can be read without decoding them again
    (``queues/log/reading.py``), once its CRC, type and id are checked, the names of a page's
    records being mostly one queue's, one exchange's and one key's.
    """

    __slots__ = ("base", "buffer", "exchange", "names", "routing_key", "view")

    def __init__(self, buffer: bytes, base: int) -> None:
        self.buffer = buffer
        self.view = memoryview(buffer)
        # Where the buffer starts in its segment.
        self.base = base
        # The encoded names of the last record decoded in full (none yet), and the names.
        self.names = b""
        self.exchange = ""
        self.routing_key = ""

    def learn(self, offset: int, record: Enqueued) -> None:
        """``record``, at ``offset``, was decoded in full and found right: if it is a routed
        record holding its body, the next ones with its names take the short way."""
        pos = offset - self.base
        if self.buffer[pos + HEADER_SIZE - 1] == ROUTED and record.body_segment is None:
            names_at = pos + ENQUEUE_RECORD_HEAD.size
            self.names = self.buffer[names_at : pos + record.payload_offset]
            self.exchange = record.exchange
            self.routing_key = record.routing_key


def _u32_at(view: memoryview, pos: int, end: int) -> int:
    if pos + 4 > end:
        raise CorruptRecord("a field runs past the end of its record")
    value: int = U32.unpack_from(view, pos)[0]
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
