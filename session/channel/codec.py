"""Frames as bytes: a length-prefixed stream, read back through a bounded buffer.

A frame is ``u32 size`` (of what follows) ``u8 kind`` and its fields, little-endian. Strings and
byte strings carry their length. :func:`encode` returns the pieces of a frame rather than one
joined buffer, so that the gateway writes them with one ``sendmsg`` and a delivery's payload is
never copied on the sending side; :class:`FrameReader` slices each payload out of its buffer
once on the receiving side. The channel joins two workers of one server, but a frame the reader
cannot make sense of still ends the channel with :class:`ChannelError` rather than an exception
deep in a queue.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Final

from sluicegate.session.channel.frames import (
    ANSWER_COUNTS,
    Answer,
    Attach,
    Attached,
    Confirm,
    Credit,
    CreditReply,
    Deliveries,
    Detach,
    Error,
    Frame,
    GiveBack,
    Kind,
    Letters,
    Publish,
    Query,
    QueryOp,
    Settle,
    Settled,
    Short,
    Stamp,
    Topology,
)
from sluicegate.wire.decoding import decode as decode_value
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import shared_header

# The frame header: the size of the rest, then the kind.
_HEAD: Final = struct.Struct("<IB")
HEAD_SIZE: Final = _HEAD.size
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_ATTACH: Final = struct.Struct("<IBBi")
_DETACH: Final = struct.Struct("<III")
_GIVE_BACK: Final = struct.Struct("<II")
_CREDIT: Final = struct.Struct("<IIIBQ")
_SHORT: Final = struct.Struct("<IQ")
_REPLY: Final = struct.Struct("<IIIQB")
_DELIVERIES: Final = struct.Struct("<II")
_SETTLE: Final = struct.Struct("<IBBI")
_PUBLISH: Final = struct.Struct("<QIBQ")
# Per published message: its size, expiry, header (ttl, delivery-count, priority) and own
# delivery-count, and the flags below.
_STAMP: Final = struct.Struct("<IqIIIBB")
# Bytes each published message adds to its frame beyond its payload.
STAMP_SIZE: Final = _STAMP.size
_CONFIRM: Final = struct.Struct("<QQB")
_QUERY: Final = struct.Struct("<IB")
_ANSWER: Final = struct.Struct(f"<IBQ{ANSWER_COUNTS}q")
_LETTERS: Final = struct.Struct("<IQ")
# Flag bits of the one-byte flag fields.
_DRAIN: Final = 1
_ECHO: Final = 2
_FAILED: Final = 1
_UNDELIVERABLE: Final = 2
_ANNOTATED: Final = 4
_DURABLE: Final = 1
_FIRST_ACQUIRER: Final = 2
_TTL: Final = 4
_EXPIRES: Final = 8
# Bytes each delivered message adds to its DELIVERIES frame's table: its sequence number and size.
DELIVERY_ENTRY_SIZE: Final = struct.calcsize("<QI")
# Bytes a frame adds around the payloads it carries, beyond their table: a DELIVERIES or PUBLISH
# frame with a 255-character vhost, queue, exchange and routing key stays under it.
FRAME_OVERHEAD: Final = 2048
# Payloads copied out by one unpack: a batch of the largest credit (max_queue_credit), and a
# compiled format of this many fields is some 12 KiB, of which struct keeps its last 100.
_UNPACKED: Final = 256
# The buffer a FrameReader keeps once it holds nothing: four reads of the channel's 64 KiB
# (gateway/proton/channel_socket.py), so that a reader grown for one large frame lets it go.
_KEPT_BUFFER: Final = 256 * 1024


class ChannelError(Exception):
    """The peer broke the channel protocol: the channel ends and its consumers detach."""


def _text(value: str) -> list[bytes]:
    data = value.encode()
    return [_U16.pack(len(data)), data]


def _blob(value: bytes) -> list[bytes]:
    return [_U32.pack(len(value)), value]


def _frame(kind: Kind, body: list[bytes]) -> list[bytes]:
    size = 1 + sum(map(len, body))
    return [_HEAD.pack(size, kind), *body]


def encode(frame: Frame) -> list[bytes]:
    """The frame's bytes, in pieces to write in order (payloads are the caller's objects)."""
    if type(frame) is Deliveries:
        count = len(frame.seqs)
        if count != len(frame.payloads):
            raise ValueError("a delivery needs one sequence number and one payload")
        table = struct.pack(f"<{count}Q{count}I", *frame.seqs, *map(len, frame.payloads))
        return _frame(
            Kind.DELIVERIES, [_DELIVERIES.pack(frame.consumer, count), table, *frame.payloads]
        )
    if type(frame) is Credit:
        flags = (_DRAIN if frame.drain else 0) | (_ECHO if frame.echo else 0)
        credit = _CREDIT.pack(
            frame.consumer, frame.delivery_count, frame.credit, flags, frame.byte_limit
        )
        return _frame(Kind.CREDIT, [credit])
    if type(frame) is Short:
        return _frame(Kind.SHORT, [_SHORT.pack(frame.consumer, frame.size)])
    if type(frame) is CreditReply:
        flags = (_DRAIN if frame.drain else 0) | (_ECHO if frame.echo else 0)
        reply = _REPLY.pack(
            frame.consumer, frame.delivery_count, frame.credit, frame.available, flags
        )
        return _frame(Kind.CREDIT_REPLY, [reply])
    if type(frame) is Settle:
        flags = (
            (_FAILED if frame.delivery_failed else 0)
            | (_UNDELIVERABLE if frame.undeliverable_here else 0)
            | (_ANNOTATED if frame.annotations is not None else 0)
        )
        head = _SETTLE.pack(frame.consumer, frame.outcome, flags, len(frame.ranges))
        bounds = [seq for pair in frame.ranges for seq in pair]
        body = [head, struct.pack(f"<{len(bounds)}Q", *bounds)]
        if frame.annotations is not None:
            body.extend(_blob(frame.annotations))
        return _frame(Kind.SETTLE, body)
    if type(frame) is Publish:
        count = len(frame.payloads)
        if count != len(frame.stamps):
            raise ValueError("a published message needs one stamp and one payload")
        pack = _STAMP.pack
        table = b"".join(
            pack(
                len(payload),
                0 if expires is None else expires,
                header.ttl or 0,
                header.delivery_count,
                delivery_count,
                header.priority,
                (_DURABLE if header.durable else 0)
                | (_FIRST_ACQUIRER if header.first_acquirer else 0)
                | (0 if header.ttl is None else _TTL)
                | (0 if expires is None else _EXPIRES),
            )
            for payload, (expires, header, delivery_count) in zip(
                frame.payloads, frame.stamps, strict=True
            )
        )
        return _frame(
            Kind.PUBLISH,
            [
                _PUBLISH.pack(frame.publish, count, frame.letters, frame.publisher),
                *_text(frame.vhost),
                *_text(frame.queue),
                *_text(frame.exchange),
                *_text(frame.routing_key),
                table,
                *frame.payloads,
            ],
        )
    if type(frame) is Confirm:
        return _frame(
            Kind.CONFIRM,
            [
                _CONFIRM.pack(frame.first, frame.last, frame.outcome),
                *_text(frame.condition),
                *_text(frame.description),
            ],
        )
    if type(frame) is Attach:
        head = _ATTACH.pack(frame.consumer, frame.ack_required, frame.browse, frame.priority)
        return _frame(
            Kind.ATTACH, [head, *_text(frame.vhost), *_text(frame.queue), *_blob(frame.filters)]
        )
    if type(frame) is Attached:
        return _frame(Kind.ATTACHED, [_U32.pack(frame.consumer)])
    if type(frame) is Detach:
        unsent = struct.pack(f"<{len(frame.unsent)}Q", *frame.unsent)
        head = _DETACH.pack(frame.consumer, frame.delivery_count, len(frame.unsent))
        return _frame(Kind.DETACH, [head, unsent])
    if type(frame) is GiveBack:
        unsent = struct.pack(f"<{len(frame.unsent)}Q", *frame.unsent)
        return _frame(Kind.GIVE_BACK, [_GIVE_BACK.pack(frame.consumer, len(frame.unsent)), unsent])
    if type(frame) is Topology:
        return _frame(Kind.TOPOLOGY, [*_text(frame.vhost), *_blob(frame.change)])
    if type(frame) is Query:
        head = _QUERY.pack(frame.query, frame.op)
        names = [*_text(frame.vhost), *_text(frame.queue)]
        return _frame(Kind.QUERY, [head, *names, *_blob(frame.declaration)])
    if type(frame) is Answer:
        if len(frame.counts) != ANSWER_COUNTS:
            raise ValueError(f"an answer carries {ANSWER_COUNTS} counts")
        return _frame(
            Kind.ANSWER, [_ANSWER.pack(frame.query, frame.found, frame.purged, *frame.counts)]
        )
    if type(frame) is Letters:
        return _frame(Kind.LETTERS, [_LETTERS.pack(frame.consumer, frame.owed)])
    assert type(frame) is Error
    return _frame(
        Kind.ERROR,
        [_U32.pack(frame.consumer), *_text(frame.condition), *_text(frame.description)],
    )


class _Body:
    """A cursor over one frame's body; any read past its end is the peer's error."""

    __slots__ = ("at", "data", "end")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.at = 0
        self.end = len(data)

    def take(self, layout: struct.Struct) -> tuple[int, ...]:
        at = self.at
        if at + layout.size > self.end:
            raise ChannelError("a frame ends inside its fields")
        self.at = at + layout.size
        return layout.unpack_from(self.data, at)

    def raw(self, size: int) -> bytes:
        at = self.at
        if at + size > self.end:
            raise ChannelError("a frame ends inside its fields")
        self.at = at + size
        return bytes(self.data[at : at + size])

    def ints(self, fmt: str, count: int) -> tuple[int, ...]:
        layout = struct.Struct(f"<{count}{fmt}")
        return self.take(layout)

    def text(self) -> str:
        (size,) = self.take(_U16)
        try:
            return self.raw(size).decode()
        except UnicodeDecodeError as error:
            raise ChannelError("a name is not UTF-8") from error

    def blob(self) -> bytes:
        (size,) = self.take(_U32)
        return self.raw(size)

    def done(self) -> None:
        if self.at != self.end:
            raise ChannelError("a frame has bytes after its fields")


def _change(data: bytes) -> bytes:
    """A topology change (or a declaration) as it crossed, checked to be one whole AMQP list
    led by its verb: a malformed one ends the channel here, as any malformed frame does,
    rather than as an exception in whatever applies it (docs/workers.md). Changes are rare
    (declarations, bindings, a channel's opening), so decoding them twice costs nothing that
    matters."""
    try:
        change, end = decode_value(data, 0)
    except DecodeError as error:
        raise ChannelError(f"a topology change does not decode: {error}") from error
    if end != len(data) or not isinstance(change, list) or not change:
        raise ChannelError("a topology change is not one whole list")
    if not isinstance(change[0], str):
        raise ChannelError("a topology change does not start with its verb")
    return data


def _settled(value: int) -> Settled:
    try:
        return Settled(value)
    except ValueError as error:
        raise ChannelError(f"unknown outcome {value}") from error


def _count(body: _Body, count: int, width: int) -> int:
    """A count of ``width``-byte items the rest of the body must hold: checked before any table
    of that size is built, so a lying count allocates nothing."""
    if count * width > body.end - body.at:
        raise ChannelError("a frame counts more items than it holds")
    return count


def _payloads(body: _Body, sizes: Sequence[int]) -> list[bytes]:
    """The payloads of ``sizes`` bytes that follow in ``body``, each copied once out of the
    receive buffer by an ``unpack_from`` of a ``{size}s`` field each, :data:`_UNPACKED` at a
    time: no Python call per message, where a slice and a copy each were a tenth of a crossing
    consumer's worker (docs/workers.md). A run's payloads are mostly of one size, whose format
    is one string repeated, and ``struct`` keeps the formats it compiled lately."""
    total = sum(sizes)
    at = body.at
    if at + total > body.end:
        raise ChannelError("a frame ends inside its fields")
    body.at = at + total
    data = body.data
    payloads: list[bytes] = []
    for start in range(0, len(sizes), _UNPACKED):
        run = sizes[start : start + _UNPACKED]
        first = run[0]
        if run.count(first) == len(run):
            layout = f"{first}s" * len(run)
        else:
            layout = "s".join(map(str, run)) + "s"
        payloads.extend(struct.unpack_from(layout, data, at))
        at += sum(run)
    return payloads


def _stamp(
    expires: int, ttl: int, header_count: int, delivery_count: int, priority: int, flags: int
) -> Stamp:
    """A message's stamp from its row of a PUBLISH frame's table (less its size)."""
    header = shared_header(
        bool(flags & _DURABLE),
        priority,
        ttl if flags & _TTL else None,
        bool(flags & _FIRST_ACQUIRER),
        header_count,
    )
    return (expires if flags & _EXPIRES else None, header, delivery_count)


def _publish(body: _Body) -> Publish:
    """A PUBLISH frame's run of messages: its names once, a table of stamps, the payloads."""
    publish, count, letters, publisher = body.take(_PUBLISH)
    vhost, queue, exchange, routing_key = body.text(), body.text(), body.text(), body.text()
    _count(body, count, _STAMP.size)
    at = body.at
    table_end = at + count * _STAMP.size
    sizes: list[int] = []
    stamps: list[Stamp] = []
    # One stamp per distinct row: a run's messages are mostly alike (the same header, no
    # expiry), so the header is looked up once, not per message.
    made: dict[tuple[int, ...], Stamp] = {}
    for row in _STAMP.iter_unpack(body.data[at:table_end]):
        sizes.append(row[0])
        key = row[1:]
        stamp = made.get(key)
        if stamp is None:
            stamp = made[key] = _stamp(*key)
        stamps.append(stamp)
    body.at = table_end
    payloads = _payloads(body, sizes)
    return Publish(
        publish, vhost, queue, exchange, routing_key, payloads, stamps, bool(letters), publisher
    )


def decode(kind: int, data: memoryview) -> Frame:
    """One frame from its kind and body (what follows the kind byte)."""
    body = _Body(data)
    frame: Frame
    if kind == Kind.DELIVERIES:
        consumer, count = body.take(_DELIVERIES)
        _count(body, count, 12)
        seqs = body.ints("Q", count)
        frame = Deliveries(consumer, seqs, tuple(_payloads(body, body.ints("I", count))))
    elif kind == Kind.CREDIT:
        consumer, delivery_count, credit, flags, byte_limit = body.take(_CREDIT)
        frame = Credit(
            consumer,
            delivery_count,
            credit,
            bool(flags & _DRAIN),
            bool(flags & _ECHO),
            byte_limit,
        )
    elif kind == Kind.SHORT:
        consumer, size = body.take(_SHORT)
        frame = Short(consumer, size)
    elif kind == Kind.CREDIT_REPLY:
        consumer, delivery_count, credit, available, flags = body.take(_REPLY)
        frame = CreditReply(
            consumer, delivery_count, credit, available, bool(flags & _DRAIN), bool(flags & _ECHO)
        )
    elif kind == Kind.SETTLE:
        consumer, outcome, flags, count = body.take(_SETTLE)
        _count(body, count, 16)
        bounds = body.ints("Q", 2 * count)
        ranges = tuple(zip(bounds[::2], bounds[1::2], strict=True))
        if any(first > last for first, last in ranges):
            raise ChannelError("a settled range ends before it starts")
        annotations = body.blob() if flags & _ANNOTATED else None
        frame = Settle(
            consumer,
            _settled(outcome),
            ranges,
            bool(flags & _FAILED),
            bool(flags & _UNDELIVERABLE),
            annotations,
        )
    elif kind == Kind.PUBLISH:
        frame = _publish(body)
    elif kind == Kind.CONFIRM:
        first, last, outcome = body.take(_CONFIRM)
        if first > last:
            raise ChannelError("a confirmed range ends before it starts")
        frame = Confirm(first, last, _settled(outcome), body.text(), body.text())
    elif kind == Kind.ATTACH:
        consumer, ack_required, browse, priority = body.take(_ATTACH)
        frame = Attach(
            consumer,
            body.text(),
            body.text(),
            bool(ack_required),
            bool(browse),
            priority,
            body.blob(),
        )
    elif kind == Kind.ATTACHED:
        (consumer,) = body.take(_U32)
        frame = Attached(consumer)
    elif kind == Kind.DETACH:
        consumer, delivery_count, count = body.take(_DETACH)
        _count(body, count, 8)
        frame = Detach(consumer, delivery_count, body.ints("Q", count))
    elif kind == Kind.GIVE_BACK:
        consumer, count = body.take(_GIVE_BACK)
        _count(body, count, 8)
        frame = GiveBack(consumer, body.ints("Q", count))
    elif kind == Kind.TOPOLOGY:
        frame = Topology(body.text(), _change(body.blob()))
    elif kind == Kind.QUERY:
        query, op = body.take(_QUERY)
        try:
            known = QueryOp(op)
        except ValueError as error:
            raise ChannelError(f"unknown query {op}") from error
        vhost, queue, declaration = body.text(), body.text(), body.blob()
        if known is QueryOp.DECLARE or known is QueryOp.DECLARE_EXCHANGE:
            _change(declaration)
        elif declaration:
            raise ChannelError(f"a {known.name} query carries a declaration")
        frame = Query(query, known, vhost, queue, declaration)
    elif kind == Kind.ANSWER:
        query, found, purged, *counts = body.take(_ANSWER)
        frame = Answer(query, bool(found), purged, tuple(counts))
    elif kind == Kind.LETTERS:
        consumer, owed = body.take(_LETTERS)
        frame = Letters(consumer, owed)
    elif kind == Kind.ERROR:
        (consumer,) = body.take(_U32)
        frame = Error(consumer, body.text(), body.text())
    else:
        raise ChannelError(f"unknown frame kind {kind}")
    body.done()
    return frame


class FrameReader:
    """Frames out of a byte stream that arrives in pieces of any size.

    The buffer holds at most one unfinished frame of at most ``max_frame_size`` bytes (the
    largest message the server takes plus :data:`FRAME_OVERHEAD`) plus the last piece read: a
    peer announcing a larger frame ends the channel before its bytes are kept. Its bytes are
    ``buffer[start:end]``; the room after them is kept from read to read, so a read is one
    ``recv_into`` with nothing allocated or zeroed for it (growing the buffer by a 64 KiB read
    per readiness was a tenth of an owner's CPU, docs/workers.md), and once every byte read is
    decoded the next read starts at the buffer's beginning again.
    """

    __slots__ = ("buffer", "end", "max_frame_size", "start")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self.buffer = bytearray()
        self.start = 0
        self.end = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Take ``data``; return the frames it completes, in order."""
        size = len(data)
        self._room(size)
        end = self.end
        self.buffer[end : end + size] = data
        self.end = end + size
        return self._frames()

    def fill(self, read: Callable[[memoryview], int], size: int) -> tuple[int, list[Frame]]:
        """Read at most ``size`` bytes straight into the buffer with ``read`` (a socket's
        ``recv_into``): the bytes read (0 at the end of the stream) and the frames completed.
        A read that fails leaves the buffer as it was."""
        self._room(size)
        end = self.end
        with memoryview(self.buffer) as view, view[end : end + size] as tail:
            count = read(tail)
        self.end = end + count
        return count, self._frames() if count else []

    def _room(self, size: int) -> None:
        """Make room for ``size`` bytes after those held: the held ones move to the front
        (a frame's unfinished part, at most ``max_frame_size``), and the buffer grows only as
        far as they and the read need."""
        buffer = self.buffer
        if self.end + size <= len(buffer):
            return
        start = self.start
        if start:
            del buffer[:start]
            self.end -= start
            self.start = 0
        missing = self.end + size - len(buffer)
        if missing > 0:
            buffer.extend(bytes(missing))

    def _frames(self) -> list[Frame]:
        frames: list[Frame] = []
        at = self.start
        end = self.end
        with memoryview(self.buffer) as view:
            while end - at >= HEAD_SIZE:
                size, kind = _HEAD.unpack_from(view, at)
                if size < 1 or size + 4 > self.max_frame_size:
                    raise ChannelError(
                        f"a frame of {size + 4} bytes, over the channel's {self.max_frame_size}"
                    )
                if end - at < size + 4:
                    break
                frames.append(decode(kind, view[at + HEAD_SIZE : at + 4 + size]))
                at += 4 + size
        if at == end:
            # All decoded: the next read starts at the front; a buffer grown for a large
            # frame goes back to what a read needs.
            self.start = self.end = 0
            if len(self.buffer) > _KEPT_BUFFER:
                self.buffer = bytearray()
        else:
            self.start = at
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not complete yet."""
        return self.end - self.start
