"""The bytes a held connection sends, read a little way ahead for the frames that free things.

The server stops reading a publisher that the memory budget or its account holds
(docs/inbound-flow-control.md), so a CLOSE, END or DETACH it sent waited behind the hold with
everything the connection held, for as long as the hold lasted: for ever, when nobody consumes.
While held, the gateway reads at most :data:`HELD_READ` bytes more into this buffer, without
handing them to proton. The frames at its start that only free things (DISPOSITION, DETACH, END,
CLOSE, empty frames) go to proton at once and make room for more; the first other frame (a
TRANSFER, FLOW, ATTACH...) stops that, and everything from it on waits for the hold to end. A
CLOSE found further on, behind such a frame, still ends the connection, without what came
before it (:attr:`Scan.close`). What the client sends beyond the buffer stays in TCP's buffers,
so however much it sends, a held connection costs :data:`HELD_READ` bytes more (through TLS,
plus the rest of one record, :data:`TLS_RECORD`), no more.

Frames are found by their headers only (AMQP 1.0 §2.3.1: size, data offset, type, channel),
from where the previous read left the frame being received (wire/disposition_frames.py).
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

__all__ = ["FREEING", "HELD_READ", "TLS_RECORD", "HeldFrames", "Scan"]

# What a held connection may make the server read and keep beyond what it read before the
# hold: a CLOSE with a long error description, or a few of the small frames that precede it,
# and as much as proton's own input buffer of an idle connection (8 KiB).
HELD_READ: Final = 8 * 1024
# The most plaintext one TLS record holds (RFC 8446 §5.1): through TLS, a read that stops at
# the held bytes' room passes on the rest of the record it began.
TLS_RECORD: Final = 16 * 1024
# Performatives that only free what the connection holds: DISPOSITION, DETACH, END, CLOSE.
FREEING: Final = frozenset({0x15, 0x16, 0x17, 0x18})
_CLOSE: Final = 0x18
_AMQP: Final = 0
# size, data offset, type (channel is not needed).
_HEADER: Final = struct.Struct(">IBB")
_HEADER_SIZE: Final = 8


class Scan(NamedTuple):
    """What the buffer holds: ``free`` bytes at its start are whole frames that free things
    (for proton now); ``close`` when a CLOSE lies behind a frame that must wait."""

    free: int
    close: bool


class HeldFrames:
    """A held connection's bytes read ahead of proton; pure."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = bytearray()

    @property
    def room(self) -> int:
        """How much more may be read."""
        return HELD_READ - len(self.data)

    def take(self) -> bytes:
        """Everything buffered, for proton: the hold has ended."""
        data = bytes(self.data)
        self.data = bytearray()
        return data

    def pop(self, count: int) -> bytes:
        """The first ``count`` bytes, for proton."""
        data = bytes(self.data[:count])
        del self.data[:count]
        return data

    def scan(self, skip: int, head: bytes) -> Scan:
        """Find the frames of the buffer; ``skip`` bytes of it end the frame proton has begun,
        or ``head`` is the start of a frame proton has and the buffer goes on with."""
        data = bytes(head) + bytes(self.data) if head else bytes(self.data)
        pos = skip
        end = len(data)
        # Bytes of a frame proton has begun are not ours to judge: they wait with the rest.
        waiting = bool(skip or head)
        free = 0
        while end - pos >= _HEADER_SIZE:
            size, doff, kind = _HEADER.unpack_from(data, pos)
            if doff < 2 or size < 4 * doff:
                break  # not AMQP framing: proton says so once the hold ends
            body = pos + 4 * doff
            if size == 4 * doff:
                code: int | None = None  # an empty frame: a heartbeat
            elif end - body < 3:
                break
            elif kind != _AMQP or data[body] != 0x00:
                code = -1
            elif data[body + 1] == 0x53:
                code = data[body + 2]
            elif data[body + 1] == 0x80:
                if end - body < 10:
                    break
                code = int.from_bytes(data[body + 2 : body + 10], "big")
            else:
                code = -1
            whole = end - pos >= size
            if not waiting and whole and (code is None or code in FREEING):
                free = pos + size
                if code == _CLOSE:
                    break  # nothing comes after a CLOSE
            elif code == _CLOSE:
                if waiting:
                    return Scan(free, close=True)
                break  # the rest of it is still to be read
            else:
                waiting = True
            pos += size
        return Scan(free, close=False)
