"""The server's one AMQP 1.0 codec (AMQP 1.0 §1): values decoded, skipped and encoded.

A broker forwards the encoded bytes it received; it reads only the few sections a feature needs
(the header for delivery-count and ttl, properties and application-properties for filters) and
never the body. This module decodes single values at an offset and skips whole values by their
width, so finding a section never walks the body's content.

Two encoders share its primitives and the wrappers of :mod:`sluicegate.wire.amqp_types`:
:func:`encode` writes what the server rewrites (a plain ``int`` in its smallest unsigned form,
as its logs and binding identities have always been written); :func:`encode_value` writes a
value with the type a client means by it (a plain ``int`` a long), for management replies and
the Spark connector, with a table of the caller's own types to take first.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Final, TypeAlias

from sluicegate.wire.amqp_types import (
    Byte,
    Described,
    Encoded,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    UInt,
    ULong,
    Utf8Array,
    Value,
)
from sluicegate.wire.decimals import decimal128
from sluicegate.wire.errors import DecodeError, EncodeError

__all__ = [
    "MAX_DEPTH",
    "Byte",
    "Described",
    "EncodeError",
    "Encoded",
    "Float32",
    "Int",
    "Short",
    "Symbol",
    "Timestamp",
    "UInt",
    "ULong",
    "Utf8Array",
    "Value",
    "decode",
    "encode",
    "encode_canonical",
    "encode_compound",
    "encode_uint",
    "encode_value",
    "encode_variable",
    "scalar_map",
    "skip",
]

_U8 = struct.Struct(">B")
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


def encode(value: Value) -> bytes:
    """Encode ``value`` with the smallest constructor that holds it."""
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, Described):
        return b"\x00" + encode(value.descriptor) + encode(value.value)
    if isinstance(value, Encoded):
        return value.raw
    if isinstance(value, int):
        sized = _SIZED_INTS.get(type(value))
        if sized is not None:
            return sized(value)
        if value < 0:
            return b"\x55" + _I8.pack(value) if value >= -128 else b"\x81" + _I64.pack(value)
        if value == 0:
            return b"\x44"
        if value < 256:
            return b"\x53" + _U8.pack(value)
        return b"\x80" + _U64.pack(value)
    if isinstance(value, float):
        return b"\x72" + _F32.pack(value) if type(value) is Float32 else b"\x82" + _F64.pack(value)
    if isinstance(value, Symbol):
        return encode_variable(value.encode("utf-8"), 0xA3, 0xB3)
    if isinstance(value, str):
        return encode_variable(value.encode("utf-8"), 0xA1, 0xB1)
    if isinstance(value, bytes):
        return encode_variable(value, 0xA0, 0xB0)
    if isinstance(value, list):
        return encode_compound(b"".join(encode(v) for v in value), len(value), 0xC0, 0xD0)
    body = b"".join(encode(k) + encode(v) for k, v in value.items())
    return encode_compound(body, 2 * len(value), 0xC1, 0xD1)


def encode_canonical(value: Value) -> bytes:
    """Encode ``value`` so that equal values of equal types give equal bytes.

    Maps are encoded with their entries sorted by their encoded keys, at every depth: a
    binding's arguments identify it whatever order a client sent them in (RabbitMQ sorts them).
    """
    if isinstance(value, dict):
        entries = sorted((encode_canonical(k), encode_canonical(v)) for k, v in value.items())
        return encode_compound(b"".join(k + v for k, v in entries), 2 * len(entries), 0xC1, 0xD1)
    if isinstance(value, list):
        body = b"".join(encode_canonical(v) for v in value)
        return encode_compound(body, len(value), 0xC0, 0xD0)
    if isinstance(value, Described):
        return b"\x00" + encode_canonical(value.descriptor) + encode_canonical(value.value)
    return encode(value)


def encode_uint(value: int) -> bytes:
    """Encode an AMQP uint (delivery-count and ttl are uints, not ulongs)."""
    if value == 0:
        return b"\x43"
    if value < 256:
        return b"\x52" + _U8.pack(value)
    return b"\x70" + _U32.pack(value)


def encode_ulong(value: int) -> bytes:
    """Encode an AMQP ulong in its smallest form."""
    if value == 0:
        return b"\x44"
    return b"\x53" + _U8.pack(value) if value < 256 else b"\x80" + _U64.pack(value)


def encode_ubyte(value: int) -> bytes:
    """Encode an AMQP ubyte (the header's priority)."""
    return b"\x50" + _U8.pack(value)


def encode_variable(raw: bytes, small: int, large: int) -> bytes:
    """A variable-width value: its ``small`` (1-byte size) or ``large`` (4-byte) constructor."""
    if len(raw) < 256:
        return bytes((small, len(raw))) + raw
    return bytes((large,)) + _U32.pack(len(raw)) + raw


def encode_compound(body: bytes, count: int, small: int, large: int) -> bytes:
    """A list or map of ``count`` encoded elements: its ``small`` or ``large`` constructor."""
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((large,)) + _U32.pack(len(body) + 4) + _U32.pack(count) + body


# The integer wrappers, each written as its type; a Timestamp is an integer too.
_SIZED_INTS: Final[dict[type, Callable[[int], bytes]]] = {
    Timestamp: lambda value: b"\x83" + _I64.pack(value),
    Byte: lambda value: b"\x51" + _I8.pack(value),
    Short: lambda value: b"\x61" + _I16.pack(value),
    Int: lambda value: b"\x71" + _I32.pack(value),
    UInt: encode_uint,
    ULong: encode_ulong,
}
# A caller's own types and how to write them, looked up by exact type before anything else.
Special: TypeAlias = Mapping[type, Callable[[object], bytes]]
_NOTHING_SPECIAL: Final[Special] = {}


def encode_value(value: object, special: Special = _NOTHING_SPECIAL) -> bytes:
    """Encode ``value`` with the AMQP type a client means by it: ``int`` a long (a ulong past a
    long's range), ``float`` a double, ``str`` a string, ``bytes`` binary, a list (or tuple),
    dict, uuid and ``Decimal`` (a decimal128) theirs, each wrapper its own; ``special`` first,
    at every depth. ``EncodeError`` for a value no AMQP type holds."""
    if special:
        own = special.get(type(value))
        if own is not None:
            return own(value)
    if isinstance(value, str):
        if isinstance(value, Symbol):
            return encode_variable(value.encode(), 0xA3, 0xB3)
        return encode_variable(value.encode(), 0xA1, 0xB1)
    if value is None:
        return b"\x40"
    if isinstance(value, bool):
        return b"\x41" if value else b"\x42"
    if isinstance(value, int):
        return _client_int(value)
    if isinstance(value, float):
        return b"\x72" + _F32.pack(value) if type(value) is Float32 else b"\x82" + _F64.pack(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return encode_variable(bytes(value), 0xA0, 0xB0)
    if isinstance(value, Utf8Array):
        return _utf8_array(value)
    if isinstance(value, list | tuple):
        if not value:
            return b"\x45"
        body = b"".join([encode_value(item, special) for item in value])
        return encode_compound(body, len(value), 0xC0, 0xD0)
    if isinstance(value, dict):
        pairs = [encode_value(part, special) for pair in value.items() for part in pair]
        return encode_compound(b"".join(pairs), len(pairs), 0xC1, 0xD1)
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, Decimal):
        return decimal128(value)
    if isinstance(value, Described):
        return (
            b"\x00" + encode_value(value.descriptor, special) + encode_value(value.value, special)
        )
    raise EncodeError(f"no AMQP type for a value of type {type(value).__name__}")


def _client_int(value: int) -> bytes:
    sized = _SIZED_INTS.get(type(value))
    if sized is not None:
        return sized(value)
    if -128 <= value < 128:
        return b"\x55" + _I8.pack(value)
    if -(1 << 63) <= value < 1 << 63:
        return b"\x81" + _I64.pack(value)
    if 0 <= value < 1 << 64:
        return b"\x80" + _U64.pack(value)  # a ulong (what a read gives for one)
    raise EncodeError(f"{value} fits no AMQP integer type")


def _utf8_array(value: list[str]) -> bytes:
    """An array of utf8 as RabbitMQ's generator frames it: each element str32 (0xB1)."""
    body = b"\xb1" + b"".join(_U32.pack(len(raw)) + raw for raw in (v.encode() for v in value))
    if len(value) < 255 and len(body) + 1 < 256:
        return bytes((0xE0, len(body) + 1, len(value))) + body
    return b"\xf0" + _U32.pack(len(body) + 4) + _U32.pack(len(value)) + body
