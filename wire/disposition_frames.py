"""The DISPOSITION frames in a client's bytes, found before proton reads them.

Proton applies a DISPOSITION to every unsettled delivery of its range, and copies the outcome
(a ``modified`` outcome's message annotations, a ``rejected`` one's error) into each of them
while it decodes the frame, before the server sees an event: one frame of 100 KB over 3,000
deliveries made 670 MiB of transient copies (issue 31). So the gateway reads each frame's
header on its way to proton, and for a DISPOSITION large enough to matter, its range, which
lies in the first bytes of its body; the gateway weighs size x range against the memory budget
(gateway/disposition_bound.py) and closes the connection before proton decodes the frame.

Every frame's header is read (its size, then a hop over the body: a few operations per frame);
only a DISPOSITION of :data:`WEIGHED_SIZE` bytes or more is decoded, and only its first fields.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

__all__ = ["PROTOCOL_HEADER", "WEIGHED_SIZE", "Disposition", "DispositionFrames"]

PROTOCOL_HEADER: Final = 8  # b"AMQP\x00\x01\x00\x00", which precedes the frames
# Below this a DISPOSITION carries no annotations nor error to speak of (an `accepted` range
# is some 25 bytes), whatever its range: it is not weighed.
WEIGHED_SIZE: Final = 128
# The descriptor (3 bytes, or 10 as a ulong), the list's header (at most 9) and role, first
# and last (at most 2, 5 and 5): what of a DISPOSITION's body must be read to weigh it.
_FIELDS: Final = 10 + 9 + 2 + 5 + 5
# A frame's size and data offset, then (past type and channel) its first 3 body bytes.
_FRAME: Final = struct.Struct(">IB3xBBB")
_U32: Final = struct.Struct(">I")
_DISPOSITION: Final = 0x15
_SERIAL_MASK: Final = 0xFFFFFFFF


class Disposition(NamedTuple):
    """A DISPOSITION about to reach proton: its frame's size and how many ids it spans."""

    size: int
    span: int


class DispositionFrames:
    """One connection's client-to-server bytes, hopped over frame by frame; pure."""

    __slots__ = ("_broken", "_head", "_skip")

    def __init__(self) -> None:
        # Bytes of the current frame still to hop over (the protocol header first).
        self._skip = PROTOCOL_HEADER
        # The start of a frame cut by a read, kept until it can be weighed.
        self._head = b""
        # Set on bytes that are not AMQP framing: proton refuses them, nothing is read.
        self._broken = False

    def cut(self) -> tuple[int, bytes] | None:
        """Where the next frame begins after the bytes scanned: how many bytes of the frame
        being received are still to come, or the start of one cut by a read; None if the
        bytes are not AMQP framing (wire/held_frames.py)."""
        return None if self._broken else (self._skip, self._head)

    def scan(self, data: bytes) -> list[Disposition]:
        """The DISPOSITION frames of :data:`WEIGHED_SIZE` bytes or more that begin in ``data``."""
        if self._broken:
            return []
        found: list[Disposition] = []
        if self._head:
            data = self._head + data
            self._head = b""
        pos = self._skip
        end = len(data)
        unpack = _FRAME.unpack_from
        while pos < end:
            if end - pos < _FRAME.size:
                self._head = data[pos:]
                self._skip = 0
                return found
            # The header and, as almost every frame has a 2-word header, the descriptor.
            size, doff, zero, code, number = unpack(data, pos)
            if doff != 2:
                if doff < 2 or size < 4 * doff:
                    self._broken = True
                    return found
                zero = 1  # not weighed unless its descriptor, further on, says DISPOSITION
                if size >= WEIGHED_SIZE and size >= 4 * doff + 3:
                    if end - pos < 4 * doff + 3:
                        self._head = data[pos:]
                        self._skip = 0
                        return found
                    zero, code, number = data[pos + 4 * doff : pos + 4 * doff + 3]
            elif size < 8:
                self._broken = True
                return found
            if (
                size >= WEIGHED_SIZE
                and zero == 0
                and (code == 0x80 or (code == 0x53 and number == _DISPOSITION))
            ):
                need = min(size, 4 * doff + _FIELDS)
                if end - pos < need:
                    self._head = data[pos:]
                    self._skip = 0
                    return found
                span = _span(data[pos + 4 * doff : pos + need])
                if span:
                    found.append(Disposition(size, span))
            pos += size
        self._skip = pos - end
        return found


def _span(body: bytes) -> int:
    """How many delivery ids the DISPOSITION whose body begins ``body`` spans; 0 if it is
    another performative or cannot be read (proton then refuses it)."""
    try:
        if body[0] != 0x00:
            return 0
        if body[1] == 0x53:
            pos = 3
        elif int.from_bytes(body[2:10], "big") == _DISPOSITION:
            pos = 10
        else:
            return 0
        kind = body[pos]
        if kind == 0xC0:
            count = body[pos + 2]
            pos += 3
        elif kind == 0xD0:
            count = _U32.unpack_from(body, pos + 5)[0]
            pos += 9
        else:
            return 0
        if count < 2:
            return 0
        pos += 2 if body[pos] == 0x56 else 1
        first, pos = _uint(body, pos)
        if first is None:
            return 0
        if count < 3:
            return 1
        last, pos = _uint(body, pos)
    except (IndexError, struct.error):
        return 0
    if last is None:
        return 1  # null: the range is its first id
    return ((last - first) & _SERIAL_MASK) + 1


def _uint(data: bytes, pos: int) -> tuple[int | None, int]:
    """A uint at ``pos`` and the position after it; None for null or another type."""
    code = data[pos]
    if code == 0x43:
        return 0, pos + 1
    if code == 0x52:
        return data[pos + 1], pos + 2
    if code == 0x70:
        return _U32.unpack_from(data, pos + 1)[0], pos + 5
    return None, pos + 1
