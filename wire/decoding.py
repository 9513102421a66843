"""Reading AMQP 1.0 values (AMQP 1.0 §1): the decoding half of the server's one codec.

A broker forwards the encoded bytes it received; it reads only the few sections a feature needs
(the header for delivery-count and ttl, properties and application-properties for filters) and
never the body. This module decodes single values at an offset and skips whole values by their
width, so finding a section never walks the body's content. Every value decoded is bounded in
depth and width, for hostile messages. :mod:`sluicegate.wire.encoding` is the writing half;
both share the wrappers of :mod:`sluicegate.wire.amqp_types`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from sluicegate.wire.amqp_types import Described, Encoded, Symbol, Timestamp, Value
from sluicegate.wire.errors import DecodeError

__all__ = ["MAX_DEPTH", "decode", "scalar_map", "skip"]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

# The width of a fixed-width value's payload, by the high nibble of its constructor (§1.2).
_FIXED_WIDTH: Final = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
# Variable-width and compound constructors: the high nibble says how wide the size field is.
_SIZE_WIDTH: Final = {0xA: 1, 0xB: 4, 0xC: 1, 0xD: 4, 0xE: 1, 0xF: 4}


# How deeply compounds may nest: sections need 3 levels, application data rarely 10; a hostile
# message must not exhaust the interpreter's recursion limit (1000 frames).
MAX_DEPTH: Final = 64
# Elements of width 0 (null, true, false, empty list...) cost no bytes, so an array's count alone
# could ask for billions of them; no real message needs more than this many.
_MAX_ZERO_WIDTH_ELEMENTS: Final = 1 << 16


def _need(buf: bytes | memoryview, end: int) -> None:
    if end > len(buf):
        raise DecodeError("value runs past the end of the message")


def _payload_end(code: int, buf: bytes | memoryview, pos: int) -> int:
    """Return where the payload of constructor ``code``, starting at ``pos``, ends."""
    nibble = code >> 4
    width = _FIXED_WIDTH.get(nibble)
    if width is not None:
        end = pos + width
    elif nibble in _SIZE_WIDTH:
        if _SIZE_WIDTH[nibble] == 1:
            _need(buf, pos + 1)
            end = pos + 1 + buf[pos]
        else:
            _need(buf, pos + 4)
            end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    else:
        raise DecodeError(f"unknown type constructor 0x{code:02x}")
    _need(buf, end)
    return end


def skip(buf: bytes | memoryview, pos: int) -> int:
    """Return the offset just past the value that starts at ``pos``, without decoding it."""
    _need(buf, pos + 1)
    code = buf[pos]
    if code == 0x00:
        return skip(buf, _skip_descriptor(buf, pos + 1))
    return _payload_end(code, buf, pos + 1)


def _skip_descriptor(buf: bytes | memoryview, pos: int) -> int:
    """Skip a descriptor, which is a symbol or a ulong, never itself described (§1.2)."""
    _need(buf, pos + 1)
    if buf[pos] == 0x00:
        raise DecodeError("a descriptor is itself described")
    return _payload_end(buf[pos], buf, pos + 1)


def _utf8(raw: bytes | memoryview) -> str:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid UTF-8 in a string") from exc


_FIXED: Final[dict[int, Callable[[bytes | memoryview, int], Value]]] = {
    0x40: lambda b, p: None,
    0x41: lambda b, p: True,
    0x42: lambda b, p: False,
    0x56: lambda b, p: b[p] != 0,
    0x43: lambda b, p: 0,
    0x44: lambda b, p: 0,
    0x45: lambda b, p: [],
    0x50: lambda b, p: b[p],
    0x51: lambda b, p: _I8.unpack_from(b, p)[0],
    0x52: lambda b, p: b[p],
    0x53: lambda b, p: b[p],
    0x54: lambda b, p: _I8.unpack_from(b, p)[0],
    0x55: lambda b, p: _I8.unpack_from(b, p)[0],
    0x60: lambda b, p: _U16.unpack_from(b, p)[0],
    0x61: lambda b, p: _I16.unpack_from(b, p)[0],
    0x70: lambda b, p: _U32.unpack_from(b, p)[0],
    0x71: lambda b, p: _I32.unpack_from(b, p)[0],
    0x72: lambda b, p: _F32.unpack_from(b, p)[0],
    0x73: lambda b, p: _U32.unpack_from(b, p)[0],
    0x80: lambda b, p: _U64.unpack_from(b, p)[0],
    0x81: lambda b, p: _I64.unpack_from(b, p)[0],
    0x82: lambda b, p: _F64.unpack_from(b, p)[0],
    0x83: lambda b, p: Timestamp(_I64.unpack_from(b, p)[0]),
    0x98: lambda b, p: bytes(b[p : p + 16]),
    0x74: lambda b, p: Encoded(b"\x74" + bytes(b[p : p + 4])),
    0x84: lambda b, p: Encoded(b"\x84" + bytes(b[p : p + 8])),
    0x94: lambda b, p: Encoded(b"\x94" + bytes(b[p : p + 16])),
}


def decode(buf: bytes | memoryview, pos: int) -> tuple[Value, int]:
    """Decode the value at ``pos``; return it and the offset just past it."""
    return _decode(buf, pos, 0)


def _decode(buf: bytes | memoryview, pos: int, depth: int) -> tuple[Value, int]:
    _need(buf, pos + 1)
    code = buf[pos]
    if code == 0x00:
        _need(buf, pos + 2)
        if buf[pos + 1] == 0x00:
            raise DecodeError("a descriptor is itself described")
        descriptor, value_pos = _decode_payload(buf[pos + 1], buf, pos + 2, depth)
        value, end = _decode(buf, value_pos, depth)
        return Described(descriptor, value), end
    return _decode_payload(code, buf, pos + 1, depth)


def _decode_payload(code: int, buf: bytes | memoryview, pos: int, depth: int) -> tuple[Value, int]:
    end = _payload_end(code, buf, pos)
    nibble = code >> 4
    if nibble in _FIXED_WIDTH:
        reader = _FIXED.get(code)
        if reader is None:
            raise DecodeError(f"unsupported type constructor 0x{code:02x}")
        return reader(buf, pos), end
    start = pos + _SIZE_WIDTH[nibble]
    if code in (0xA0, 0xB0):
        return bytes(buf[start:end]), end
    if code in (0xA1, 0xB1):
        return _utf8(buf[start:end]), end
    if code in (0xA3, 0xB3):
        return Symbol(_utf8(buf[start:end])), end
    if depth >= MAX_DEPTH:
        raise DecodeError(f"compound values nested deeper than {MAX_DEPTH}")
    if code in (0xC0, 0xD0, 0xC1, 0xD1):
        items = _items(buf, start, end, _SIZE_WIDTH[nibble], depth + 1)
        return (items if code in (0xC0, 0xD0) else _to_map(items)), end
    if code in (0xE0, 0xF0):
        return _array(buf, start, end, _SIZE_WIDTH[nibble], depth + 1), end
    raise DecodeError(f"unsupported type constructor 0x{code:02x}")


def _count(buf: bytes | memoryview, pos: int, width: int) -> int:
    _need(buf, pos + width)
    count: int = buf[pos] if width == 1 else _U32.unpack_from(buf, pos)[0]
    return count


def _to_map(items: list[Value]) -> dict[Value, Value]:
    if len(items) % 2:
        raise DecodeError("a map has an odd number of items")
    result: dict[Value, Value] = {}
    for i in range(0, len(items), 2):
        key = items[i]
        if isinstance(key, list | dict):
            raise DecodeError("a map key is a compound value")
        result[key] = items[i + 1]
    return result


def _items(buf: bytes | memoryview, start: int, end: int, width: int, depth: int) -> list[Value]:
    """Decode a list's or a map's items.

    Every message's annotations and application-properties are decoded at the door, so the
    common items (short strings and symbols, fixed-width scalars) are read here inline: a call
    per item through :func:`_decode` made a four-entry map cost several times as much.
    """
    count = _count(buf, start, width)
    pos = start + width
    items: list[Value] = []
    append = items.append
    for _ in range(count):
        if pos >= end:
            raise DecodeError("a compound value has fewer items than its count")
        code = buf[pos]
        if code == 0xA1 or code == 0xA3:
            stop = pos + 2 + (buf[pos + 1] if pos + 1 < end else end)
            if stop > end:
                raise DecodeError("an item runs past the end of its compound value")
            try:
                text = str(buf[pos + 2 : stop], "utf-8")
            except UnicodeDecodeError as exc:
                raise DecodeError("invalid UTF-8 in a string") from exc
            append(text if code == 0xA1 else Symbol(text))
            pos = stop
            continue
        reader = _FIXED.get(code)
        if reader is not None:
            stop = pos + 1 + _FIXED_WIDTH[code >> 4]
            if stop > end:
                raise DecodeError("an item runs past the end of its compound value")
            append(reader(buf, pos + 1))
            pos = stop
            continue
        value, pos = _decode(buf, pos, depth)
        if pos > end:
            raise DecodeError("an item runs past the end of its compound value")
        append(value)
    return items


# Each scalar item's whole width (constructor included) where it can stand as a map key too,
# else 0: what :func:`scalar_map` steps over. The empty list (0x45) is a compound.
_SCALAR_WIDTH: Final = tuple(
    1 + _FIXED_WIDTH[code >> 4] if code in _FIXED and code != 0x45 else 0 for code in range(256)
)


def scalar_map(buf: bytes | memoryview, pos: int, end: int) -> bool:
    """Whether the value at ``pos`` (ending at ``end``) is a map that :func:`decode` reads, made
    only of short strings, symbols and binaries and of fixed-width scalars.

    The check builds no value: every message's application-properties are checked at the door
    (wire/envelope.py) and decoding them only to drop them cost most of that check. False says
    nothing about the value: it may still decode (nested, long or non-UTF-8 items); decode it.
    """
    code = buf[pos]
    if code == 0xC1 and pos + 3 <= end:
        count = buf[pos + 2]
        item = pos + 3
        stop = pos + 2 + buf[pos + 1]
    elif code == 0xD1 and pos + 9 <= end:
        count = _U32.unpack_from(buf, pos + 5)[0]
        item = pos + 9
        stop = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
    else:
        return False
    if stop != end or count % 2:
        return False
    widths = _SCALAR_WIDTH
    for _ in range(count):
        if item >= end:
            return False
        code = buf[item]
        width = widths[code]
        if width:
            item += width
            continue
        if code != 0xA1 and code != 0xA3 and code != 0xA0:
            return False
        if item + 1 >= end:
            return False
        start = item + 2
        item = start + buf[item + 1]
        if item > end:
            return False
        if code != 0xA0:
            try:
                str(buf[start:item], "utf-8")
            except UnicodeDecodeError:
                return False
    return item == end


def _array(buf: bytes | memoryview, start: int, end: int, width: int, depth: int) -> list[Value]:
    """Decode an array: one constructor shared by every element (§1.6.24)."""
    count = _count(buf, start, width)
    pos = start + width
    if pos > end:
        raise DecodeError("an array's count runs past its size")
    _need(buf, pos + 1)
    descriptor: Value = None
    described = buf[pos] == 0x00
    if described:
        _need(buf, pos + 2)
        if buf[pos + 1] == 0x00:
            raise DecodeError("a descriptor is itself described")
        descriptor, pos = _decode_payload(buf[pos + 1], buf, pos + 2, depth)
    _need(buf, pos + 1)
    code = buf[pos]
    pos += 1
    if _FIXED_WIDTH.get(code >> 4) == 0 and count > _MAX_ZERO_WIDTH_ELEMENTS:
        raise DecodeError(f"an array of {count} empty elements")
    items: list[Value] = []
    for _ in range(count):
        value, pos = _decode_payload(code, buf, pos, depth)
        if pos > end:
            raise DecodeError("an array element runs past the end of the array")
        items.append(Described(descriptor, value) if described else value)
    return items
