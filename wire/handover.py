"""Handing a plain connection to the worker that owns the queue its first link names; pure.

With ``--workers N`` the kernel gives a connection to any worker, and a client of another
worker's queue then crosses the channel for every message (docs/workers.md). When a plain
connection's first link attaches to such a queue and nothing else is open on it yet (one
session, this one link, nothing unsettled), its worker hands the socket to the queue's worker,
which serves it as if it had accepted it (docs/workers.md#handing-a-connection-over).

- :class:`Recording`: the bytes a connection read and wrote until its first ATTACH, which the
  taking worker replays; the ATTACH and whatever followed it are kept from proton until the
  hand-over is decided. At most :data:`MAX_RECORDED` bytes, beyond which the connection is not
  handed over.
- :class:`Expected`: the taking worker's check that its own server wrote exactly what the
  giving one did (SASL, the AMQP header, OPEN, BEGIN) before it takes the connection.
- The messages between the two workers (:func:`encode`, :func:`decode`), and
  :func:`attach_address`, which reads what queue the ATTACH names.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Final, NamedTuple

from sluicegate.wire.amqp_types import Described
from sluicegate.wire.decoding import decode
from sluicegate.wire.errors import DecodeError

__all__ = [
    "MAX_RECORDED",
    "Expected",
    "HandoverError",
    "Kind",
    "Message",
    "Recording",
    "attach_address",
    "decode_message",
    "encode",
]

# Bytes a connection may read and write before its first ATTACH and still be handed over: a
# SASL PLAIN exchange, OPEN, BEGIN and an ATTACH with its filters take a few hundred bytes; a
# client whose handshake is larger (long properties, a large filter set) keeps its worker. It
# bounds what each connection holds for this, and what one message between workers carries.
MAX_RECORDED: Final = 64 * 1024
_AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
_FRAME: Final = struct.Struct(">IBB")
_FRAME_HEADER: Final = 8
_AMQP_FRAME: Final = 0
# The performatives a connection may send before it can be handed over, in this order.
_OPEN: Final = 0x10
_BEGIN: Final = 0x11
_ATTACH: Final = 0x12
_SOURCE: Final = 0x28
_TARGET: Final = 0x29
_SYMBOLS: Final = {
    "amqp:open:list": _OPEN,
    "amqp:begin:list": _BEGIN,
    "amqp:attach:list": _ATTACH,
    "amqp:source:list": _SOURCE,
    "amqp:target:list": _TARGET,
}


class HandoverError(Exception):
    """A message between workers that does not decode: the sender is not a sibling worker or
    is broken; the message is dropped."""


class Recording:
    """One plain connection's bytes until its first ATTACH.

    ``read`` and ``written`` are the socket's bytes both ways; :meth:`inbound` sees the AMQP
    bytes after SASL on their way to proton and keeps back everything from the third frame on
    if it is an ATTACH after one OPEN and one BEGIN (heartbeats aside). ``notify`` is called
    once that ATTACH is whole. Anything else (another frame there, more than
    :data:`MAX_RECORDED` bytes) ends the recording: :attr:`over`.
    """

    __slots__ = (
        "_frames",
        "_given",
        "_next",
        "_notify",
        "_stream",
        "held",
        "offered",
        "over",
        "read",
        "written",
    )

    def __init__(self, notify: Callable[[], None]) -> None:
        self.read = bytearray()
        self.written = bytearray()
        # The AMQP bytes seen so far, the offset of the next frame in them, frames seen.
        self._stream = bytearray()
        self._next = 0
        self._frames = 0
        # Bytes of the stream given to proton.
        self._given = 0
        self._notify = notify
        # From the ATTACH on: kept from proton until the hand-over is decided.
        self.held: bytearray | None = None
        self.over = False
        # Set once offered to another worker: nothing more is written until it answers.
        self.offered = False

    @property
    def size(self) -> int:
        """Bytes recorded both ways."""
        return len(self.read) + len(self.written)

    def took(self, data: bytes) -> None:
        """``data`` was read from the socket."""
        if not self.over:
            self.read += data
            self._check_size()

    def wrote(self, data: bytes) -> None:
        """``data`` was written to the socket."""
        if not self.over:
            self.written += data
            self._check_size()

    def _check_size(self) -> None:
        if self.size > MAX_RECORDED:
            # Too much to hand over: what was recorded is of no more use.
            self.over = True
            self.read = bytearray()
            self.written = bytearray()

    @property
    def attach(self) -> bytes | None:
        """The ATTACH frame once whole, else None."""
        held = self.held
        if held is None or len(held) < _FRAME_HEADER:
            return None
        (size, _, _) = _FRAME.unpack_from(held)
        return bytes(held[:size]) if len(held) >= size else None

    def inbound(self, data: bytes) -> bytes:
        """What of ``data`` proton may have now; the rest is kept in :attr:`held`.

        After the BEGIN nothing reaches proton until the next frame is known not to be an
        ATTACH: proton must never see the ATTACH of a connection that may still be handed over.
        """
        if self.over and self.held is None and not self._stream:
            return data
        held = self.held
        if held is not None:
            whole = self.attach is not None
            held += data
            if not whole and self.attach is not None:
                self._notify()
            return b""
        stream = self._stream
        stream += data
        at = self._scan()
        given = self._given
        if self.over:
            rest = bytes(stream[given:])
            self._stream = bytearray()
            return rest
        if at is not None:
            self.held = bytearray(stream[at:])
            self._stream = bytearray()
            if self.attach is not None:
                self._notify()
            return bytes(stream[given:at])
        limit = self._next if self._frames == 2 else len(stream)
        self._given = limit
        return bytes(stream[given:limit])

    def _scan(self) -> int | None:
        """The ATTACH's offset in the stream once its performative is seen; sets
        :attr:`over` on anything a hand-over cannot follow."""
        stream = self._stream
        if self._next == 0:
            if len(stream) < len(_AMQP_HEADER):
                return None
            if stream[: len(_AMQP_HEADER)] != _AMQP_HEADER:
                self.over = True
                return None
            self._next = len(_AMQP_HEADER)
        while len(stream) >= self._next + _FRAME_HEADER:
            pos = self._next
            size, offset, kind = _FRAME.unpack_from(stream, pos)
            body = pos + 4 * offset
            if kind != _AMQP_FRAME or size < _FRAME_HEADER or offset < 2 or body > pos + size:
                self.over = True
                return None
            if body == pos + size:
                self._next = pos + size  # a heartbeat
                continue
            if len(stream) < body + 3:
                return None
            performative = _performative(bytes(stream[body : body + 3]))
            expected = (_OPEN, _BEGIN, _ATTACH)[self._frames]
            if performative != expected:
                self.over = True
                return None
            if performative == _ATTACH:
                return pos
            if len(stream) < pos + size:
                return None
            self._frames += 1
            self._next = pos + size
        return None

    def give_up(self) -> bytes:
        """End the recording: what was kept back, for proton."""
        self.over = True
        kept = bytes(self.held) if self.held is not None else bytes(self._stream[self._given :])
        self.held = None
        self._stream = bytearray()
        return kept


def _performative(head: bytes) -> int | None:
    """The code of a performative from its first bytes (``0x00 0x53 code``), or None."""
    if head[0] == 0x00 and head[1] == 0x53:
        return head[2]
    return None


class Link(NamedTuple):
    """What a first ATTACH asks: whether the client receives (a consumer), and its address."""

    receiver: bool
    address: str | None


def attach_address(frame: bytes) -> Link | None:
    """The role and the address of the queue an ATTACH frame names (a consumer's source, a
    publisher's target); None if it does not decode as an ATTACH."""
    (_, offset, _) = _FRAME.unpack_from(frame)
    try:
        value, _ = decode(frame, 4 * offset)
    except DecodeError:
        return None
    if not isinstance(value, Described) or _code(value.descriptor) != _ATTACH:
        return None
    fields = value.value
    if not isinstance(fields, list) or len(fields) < 3 or not isinstance(fields[2], bool):
        return None
    receiver = fields[2]
    index = 5 if receiver else 6
    terminus = fields[index] if len(fields) > index else None
    if not isinstance(terminus, Described) or not isinstance(terminus.value, list):
        return Link(receiver, None)
    if _code(terminus.descriptor) != (_SOURCE if receiver else _TARGET) or not terminus.value:
        return Link(receiver, None)
    address = terminus.value[0]
    return Link(receiver, address if isinstance(address, str) else None)


def _code(descriptor: object) -> int | None:
    if isinstance(descriptor, int):
        return descriptor
    if isinstance(descriptor, str):
        return _SYMBOLS.get(descriptor)
    return None


class Expected:
    """The bytes the taking worker's server must write before it takes the connection: the
    giving worker wrote exactly those, so its own are dropped, and the first one that differs
    refuses the hand-over."""

    __slots__ = ("_data", "_pos", "failed")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self.failed = False

    def take(self, data: bytes) -> None:
        """The server wrote ``data``."""
        if self.failed or not data:
            return
        end = self._pos + len(data)
        if self._data[self._pos : end] != data:
            self.failed = True
            return
        self._pos = end

    @property
    def done(self) -> bool:
        """Everything expected was written, nothing else."""
        return not self.failed and self._pos == len(self._data)


class Kind(IntEnum):
    """What a message between two workers says about one hand-over."""

    # The giver: here are the socket and its bytes.
    OFFER = 1
    # The taker: my server wrote the same; I take it if you let go.
    READY = 2
    # The taker: I will not take it; the giver serves on.
    REFUSE = 3
    # The giver: it is yours; I have let go.
    GO = 4
    # The giver: too late, I serve on; drop it.
    ABORT = 5


# kind, the sender's worker index, the giver's serial, the giver's deadline (monotonic s).
_HEAD: Final = struct.Struct(">BHId")
# An offer's sizes: bytes read, of them kept from proton (the tail), bytes written.
_SIZES: Final = struct.Struct(">III")


class Message(NamedTuple):
    """One message between two workers; ``read``, ``held`` and ``written`` are an offer's."""

    kind: Kind
    worker: int
    serial: int
    deadline: float
    read: bytes = b""
    held: int = 0
    written: bytes = b""


def encode(message: Message) -> bytes:
    """The message as one datagram."""
    head = _HEAD.pack(message.kind, message.worker, message.serial, message.deadline)
    if message.kind is not Kind.OFFER:
        return head
    sizes = _SIZES.pack(len(message.read), message.held, len(message.written))
    return head + sizes + message.read + message.written


def decode_message(data: bytes) -> Message:
    """A datagram read; :class:`HandoverError` if it is not one of ours."""
    if len(data) < _HEAD.size:
        raise HandoverError("a hand-over message shorter than its header")
    kind_code, worker, serial, deadline = _HEAD.unpack_from(data)
    try:
        kind = Kind(kind_code)
    except ValueError:
        raise HandoverError(f"unknown hand-over message kind {kind_code}") from None
    if kind is not Kind.OFFER:
        if len(data) != _HEAD.size:
            raise HandoverError("a hand-over reply with trailing bytes")
        return Message(kind, worker, serial, deadline)
    if len(data) < _HEAD.size + _SIZES.size:
        raise HandoverError("a hand-over offer shorter than its sizes")
    read, held, written = _SIZES.unpack_from(data, _HEAD.size)
    start = _HEAD.size + _SIZES.size
    if read + written > MAX_RECORDED or held > read or start + read + written != len(data):
        raise HandoverError("a hand-over offer whose sizes do not match its bytes")
    return Message(
        kind,
        worker,
        serial,
        deadline,
        data[start : start + read],
        held,
        data[start + read :],
    )
