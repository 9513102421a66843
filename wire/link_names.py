"""Link names made unique for proton, as RabbitMQ lets clients repeat them.

AMQP 1.0 §2.6.1 wants a link's name unique among the links of its direction between two
containers, and proton-c enforces it per session: an ATTACH naming a link of the same role
that is still attached closes the *connection* with ``amqp:invalid-field`` "link name already
attached" (``pn_do_attach``), before the server sees anything. RabbitMQ keys links by handle
and accepts the repeat, and its clients rely on it: they name every link
``<container-id>-<address>``, so a second publisher (or consumer) on one address on one
connection repeats a name.

So the bytes between the socket and proton are rewritten, in ATTACH frames only:

- **Client to proton**: an ATTACH whose name is attached already in its session and role, or
  ends like a rewritten one, gets the suffix ``~dupNNNN`` (the lowest hexadecimal number free
  in that session and role, so the two halves of a repeated management pair keep one name).
  DETACH and END frames are read to know which names are attached.
- **Proton to client**: an ATTACH whose name ends with the suffix loses it again. The frame
  keeps its length: the eight bytes go to its extended header (``doff`` grows by two, which
  every AMQP 1.0 peer skips, §2.3.1), so proton's output is taken and counted byte for byte.

Since no name proton holds ends with the suffix unless this module put it there, stripping is
exact. Every frame's header is read (its size and performative: a few operations per frame);
only ATTACH, DETACH and END frames, which are rare, are decoded. Until a name of the connection
is rewritten, proton's frames are only hopped over by their sizes.
"""

from __future__ import annotations

import re
import struct
from typing import Final, TypeAlias

from sluicegate.wire.decoding import decode
from sluicegate.wire.errors import DecodeError

Buffer: TypeAlias = bytes | bytearray | memoryview
PROTOCOL_HEADER: Final = b"AMQP\x00\x01\x00\x00"
# What marks a rewritten name: eight bytes, so the frame proton writes is two words longer.
_SUFFIX: Final = re.compile(rb"~dup[0-9a-f]{4}\Z")
_SUFFIX_LENGTH: Final = 8
_MAX_SUFFIX: Final = 0xFFFF
_FRAME: Final = struct.Struct(">IBBH")
_U32: Final = struct.Struct(">I")
_ATTACH: Final = 0x12
_DETACH: Final = 0x16
_END: Final = 0x17
_READ_CODES: Final = (_ATTACH, _DETACH, _END)
# What :meth:`LinkNames._classify` says to do with a frame.
_SKIP: Final = "skip"
_READ: Final = "read"
_HOLD: Final = "hold"
_PASS: Final = "pass"


class _Attach:
    """Where an ATTACH frame's name is, and the fields read before and after it."""

    __slots__ = ("body", "list_code", "name", "name_code", "name_end", "name_start")

    def __init__(self, frame: Buffer, body: int) -> None:
        self.body = body
        first = _first_field(frame, body)
        self.list_code = frame[body + 3]
        self.name_code = frame[first]
        if self.name_code == 0xA1:
            self.name_start = first + 2
            self.name_end = self.name_start + frame[first + 1]
        elif self.name_code == 0xB1:
            self.name_start = first + 5
            self.name_end = self.name_start + _U32.unpack_from(frame, first + 1)[0]
        else:
            raise ValueError("an ATTACH without a name")
        if self.name_end > len(frame):
            raise ValueError("an ATTACH name runs past its frame")
        self.name = bytes(frame[self.name_start : self.name_end])


def _performative(data: Buffer, body: int) -> int:
    """The performative's small-ulong descriptor code, or 0 for any other descriptor."""
    if data[body] == 0x00 and data[body + 1] == 0x53:
        code: int = data[body + 2]
        return code
    return 0


class LinkNames:
    """One connection's rewriting, both ways; pure, fed the bytes the gateway moves."""

    __slots__ = (
        "_attached",
        "_broken",
        "_held",
        "_links",
        "_out_base",
        "_out_next",
        "_out_patches",
        "_skip",
        "_want",
        "max_frame",
        "renamed",
    )

    def __init__(self, max_frame: int) -> None:
        # The largest frame proton takes: a bigger ATTACH is passed on for proton to refuse.
        self.max_frame = max_frame
        # Client to proton: bytes of the current frame still to pass unread; the bytes held
        # back (a frame header cut by a read, or an ATTACH, DETACH or END not yet whole) and
        # how many of them are wanted before deciding.
        self._skip = len(PROTOCOL_HEADER)
        self._held = bytearray()
        self._want = 0
        # Set on bytes that are not AMQP framing: everything passes unread, proton refuses it.
        self._broken = False
        # Attached links by channel and handle: their role and the name proton knows.
        self._links: dict[int, dict[int, tuple[bool, bytes]]] = {}
        # The names proton holds attached, by (channel, role).
        self._attached: dict[tuple[int, bool], set[bytes]] = {}
        # Proton to client: the stream offset of proton's next unread frame, of its first
        # byte not yet taken, and the rewritten ATTACH frames not wholly taken yet.
        self._out_next = len(PROTOCOL_HEADER)
        self._out_base = 0
        self._out_patches: list[tuple[int, bytes]] = []
        # How many ATTACH names were made unique (for statistics and tests).
        self.renamed = 0

    # -- client to proton -----------------------------------------------------------------

    def inbound(self, data: bytes) -> bytes:
        """The bytes to give proton for ``data`` read from the client (some may be held)."""
        if self._broken:
            return data
        pieces: list[bytes] = []
        pos = self._fill(data, pieces) if self._held else 0
        if self._held:
            return b"".join(pieces)
        run = pos
        end = len(data)
        while pos < end:
            if self._skip:
                taken = min(self._skip, end - pos)
                self._skip -= taken
                pos += taken
                continue
            action, count = self._classify(data, pos, end - pos)
            if action is _HOLD:
                self._held += data[pos:]
                self._want = count
                break
            if action is _READ:
                pieces.append(data[run:pos])
                pieces.append(self._read(memoryview(data)[pos : pos + count]))
                pos += count
                run = pos
            elif action is _SKIP:
                self._skip = count
            else:
                pos = end
        if not pieces:
            return data if run == 0 and not self._held else data[run:pos]
        pieces.append(data[run:pos])
        return b"".join(pieces)

    def _classify(self, data: Buffer, pos: int, available: int) -> tuple[str, int]:
        """What to do with the frame at ``pos``: skip, read or hold it (and its byte count).

        Held means more bytes are needed to decide; the count is how many, from ``pos``.
        """
        if available < _FRAME.size:
            return _HOLD, _FRAME.size
        size, doff, _, _ = _FRAME.unpack_from(data, pos)
        body = 4 * doff
        if doff < 2 or size < body:
            self._broken = True
            return _PASS, 0
        if size < body + 3:
            # An empty frame (a heartbeat, passed on at once) or one too short for proton.
            return _SKIP, size
        if available < body + 3:
            return _HOLD, body + 3
        if _performative(data, pos + body) not in _READ_CODES or size > self.max_frame:
            return _SKIP, size
        if available < size:
            return _HOLD, size
        return _READ, size

    def _fill(self, data: bytes, pieces: list[bytes]) -> int:
        """Complete the held bytes from ``data``; return how much of it was used."""
        held = self._held
        pos = 0
        while held:
            taken = max(0, min(self._want - len(held), len(data) - pos))
            held += data[pos : pos + taken]
            pos += taken
            if len(held) < self._want:
                return pos
            action, count = self._classify(held, 0, len(held))
            if action is _HOLD:
                self._want = count
                continue
            if action is _PASS:
                pieces.append(bytes(held) + data[pos:])
                held.clear()
                return len(data)
            frame = bytes(held[:count])
            pieces.append(self._read(memoryview(frame)) if action is _READ else frame)
            if count >= len(held):
                self._skip = count - len(held)
                held.clear()
            else:
                del held[:count]
                self._want = _FRAME.size
        return pos

    def _read(self, frame: memoryview) -> bytes:
        """Note an ATTACH, DETACH or END; return the frame as proton must see it."""
        _, doff, _, channel = _FRAME.unpack_from(frame, 0)
        body = 4 * doff
        code = _performative(frame, body)
        try:
            if code == _ATTACH:
                return self._attach(frame, channel, body)
            if code == _DETACH:
                handle, _ = decode(frame, _first_field(frame, body))
                if isinstance(handle, int):
                    self._detached(channel, handle)
            else:
                self._links.pop(channel, None)
                self._attached.pop((channel, True), None)
                self._attached.pop((channel, False), None)
        except (ValueError, IndexError, struct.error, DecodeError):
            # Not well formed: proton refuses it and tells the client; nothing is noted.
            pass
        return bytes(frame)

    def _attach(self, frame: memoryview, channel: int, body: int) -> bytes:
        fields = _Attach(frame, body)
        handle, after = decode(frame, fields.name_end)
        role, _ = decode(frame, after)
        if not isinstance(handle, int) or not isinstance(role, bool):
            return bytes(frame)
        self._detached(channel, handle)
        attached = self._attached.setdefault((channel, role), set())
        name = fields.name
        if name in attached or _SUFFIX.search(name):
            renamed = _free_name(name, attached)
            if renamed is not None:
                frame = memoryview(_renamed(frame, fields, renamed))
                name = renamed
                self.renamed += 1
        self._links.setdefault(channel, {})[handle] = (role, name)
        attached.add(name)
        return bytes(frame)

    def _detached(self, channel: int, handle: int) -> None:
        link = self._links.get(channel, {}).pop(handle, None)
        if link is not None:
            self._attached[(channel, link[0])].discard(link[1])

    # -- proton to client -----------------------------------------------------------------

    def outbound(self, data: bytes) -> bytes:
        """What of proton's pending output ``data`` may go to the client now, rewritten.

        ``data`` starts at the first byte not yet taken (:meth:`taken`). The result may be
        shorter: it stops before a frame whose performative is not known yet, and before an
        ATTACH proton has not wholly handed over.
        """
        base = self._out_base
        position = self._out_next
        if not self.renamed:
            # No name was rewritten, so no ATTACH proton writes can carry the suffix: the
            # frames are only hopped over, to know where the next one starts, and the output
            # stops before a frame whose size is not whole yet.
            end = base + len(data)
            size_at = _U32.unpack_from
            while position + _U32.size <= end:
                position += size_at(data, position - base)[0]
            self._out_next = position
            return data if position >= end else data[: position - base]
        cut = len(data)
        while True:
            offset = position - base
            if offset >= len(data):
                break
            if offset + _FRAME.size > len(data):
                cut = offset
                break
            size, doff, _, _ = _FRAME.unpack_from(data, offset)
            body = offset + 4 * doff
            if size >= 4 * doff + 3 and body + 3 > len(data):
                cut = offset
                break
            if size >= 4 * doff + 3 and _performative(data, body) == _ATTACH:
                if offset + size > len(data):
                    cut = offset
                    break
                patched = _restored(memoryview(data)[offset : offset + size], 4 * doff)
                if patched is not None:
                    self._out_patches.append((position, patched))
            position += size
        self._out_next = position
        if not self._out_patches:
            return data if cut == len(data) else data[:cut]
        out = bytearray(data[:cut])
        for start, patched in self._out_patches:
            low = max(start, base)
            high = min(start + len(patched), base + cut)
            if low < high:
                out[low - base : high - base] = patched[low - start : high - start]
        return bytes(out)

    def taken(self, count: int) -> None:
        """``count`` more bytes of proton's output went to the client."""
        self._out_base += count
        base = self._out_base
        if self._out_patches:
            self._out_patches = [p for p in self._out_patches if p[0] + len(p[1]) > base]


def _first_field(frame: Buffer, body: int) -> int:
    """Where the first field of a performative's list starts."""
    code = frame[body + 3]
    if code == 0xC0:
        return body + 6
    if code == 0xD0:
        return body + 12
    raise ValueError("a performative whose fields are not a list")


def _free_name(name: bytes, attached: set[bytes]) -> bytes | None:
    """The name with the lowest free suffix; None if all are taken (proton will refuse).

    One of the first ``len(attached) + 1`` suffixes is free, so the search costs at most one
    look-up per link attached in the session and role, as the gateway's link count does.
    """
    for number in range(1, min(len(attached) + 1, _MAX_SUFFIX) + 1):
        candidate = b"%s~dup%04x" % (name, number)
        if candidate not in attached:
            return candidate
    return None


def _renamed(frame: memoryview, fields: _Attach, name: bytes) -> bytes:
    """The ATTACH frame with ``name``: its fields re-encoded as a list32, the rest as it was."""
    body = fields.body
    if fields.list_code == 0xC0:
        count = frame[body + 5]
        list_end = body + 5 + frame[body + 4]
    else:
        count = _U32.unpack_from(frame, body + 8)[0]
        list_end = body + 8 + _U32.unpack_from(frame, body + 4)[0]
    if len(name) < 256:
        encoded_name = bytes((0xA1, len(name))) + name
    else:
        encoded_name = b"\xb1" + _U32.pack(len(name)) + name
    fields_bytes = encoded_name + bytes(frame[fields.name_end : list_end])
    performative = (
        bytes(frame[body : body + 3])
        + b"\xd0"
        + _U32.pack(len(fields_bytes) + 4)
        + _U32.pack(count)
        + fields_bytes
    )
    rest = bytes(frame[list_end:])
    header = bytearray(frame[:body])
    header[0:4] = _U32.pack(body + len(performative) + len(rest))
    return bytes(header) + performative + rest


def _restored(frame: memoryview, body: int) -> bytes | None:
    """Proton's ATTACH with the suffix taken off its name, at the same length; None if none."""
    try:
        fields = _Attach(frame, body)
    except (ValueError, IndexError, struct.error):
        return None
    if not _SUFFIX.search(fields.name):
        return None
    size = len(frame)
    out = bytearray(frame[:body])
    # The frame grows two words of extended header, the name loses eight bytes.
    out[4] = frame[4] + _SUFFIX_LENGTH // 4
    out += bytes(_SUFFIX_LENGTH)
    performative = bytearray(frame[body : fields.name_start])
    list_at = 3
    if fields.list_code == 0xC0:
        performative[list_at + 1] -= _SUFFIX_LENGTH
    else:
        length = _U32.unpack_from(performative, list_at + 1)[0]
        performative[list_at + 1 : list_at + 5] = _U32.pack(length - _SUFFIX_LENGTH)
    name_at = fields.name_start - body - (2 if fields.name_code == 0xA1 else 5)
    if fields.name_code == 0xA1:
        performative[name_at + 1] -= _SUFFIX_LENGTH
    else:
        performative[name_at + 1 : name_at + 5] = _U32.pack(len(fields.name) - _SUFFIX_LENGTH)
    out += performative
    out += frame[fields.name_start : fields.name_end - _SUFFIX_LENGTH]
    out += frame[fields.name_end :]
    assert len(out) == size
    return bytes(out)
