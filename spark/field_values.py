"""AMQP values as a client reads them, types kept, the common encodings inline (AMQP 1.0 §1.6).

The server's codec (``wire/decoding.py``) decodes the few sections the server acts on and gives
every integer as a plain ``int``; a client such as the Spark connector reads every field of
every message and keeps each value's AMQP type where Python would lose it: a uuid is a
:class:`uuid.UUID`, a char a one-character ``str``, a timestamp a ``Timestamp``, a symbol a
``Symbol``, a decimal a :class:`decimal.Decimal`, an AMQP float (32 bits) a ``Float32``, a byte,
short or int a ``Byte``, ``Short`` or ``Int`` (an unsigned ubyte or ushort the next wider signed
type); a long, uint and ulong are plain ``int``. The wrappers are the codec's
(``wire/amqp_types.py``), which writes them back with the same types.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Final, TypeAlias, cast

from sluicegate.wire.amqp_types import (
    Byte,
    Described,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    Value,
)
from sluicegate.wire.decimals import read_decimal
from sluicegate.wire.decoding import decode
from sluicegate.wire.errors import DecodeError

# What a field decodes to: the codec's values, and the types only a client reads.
Field: TypeAlias = (
    "bool | int | float | str | bytes | list[Field] | dict[Field, Field] | Described"
    " | uuid.UUID | Decimal | None"
)

I64: Final = struct.Struct(">q")
U32: Final = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_I8 = struct.Struct(">b")


def read_value(buf: bytes, pos: int) -> tuple[Field, int]:
    """The value at ``pos`` and where it ends: the encodings messages mostly carry inline (a
    client's per-message path), the rest through a table by constructor, or the codec."""
    code = buf[pos]
    if code == 0xA1:
        end = pos + 2 + buf[pos + 1]
        return buf[pos + 2 : end].decode(), end
    if code == 0xA3:
        end = pos + 2 + buf[pos + 1]
        return Symbol(buf[pos + 2 : end].decode()), end
    if code == 0x40:
        return None, pos + 1
    if code == 0xA0:
        end = pos + 2 + buf[pos + 1]
        return buf[pos + 2 : end], end
    if code == 0xC0 or code == 0xC1:
        end = pos + 2 + buf[pos + 1]
        items = read_items(buf, pos + 3, end, buf[pos + 2])
        return (items if code == 0xC0 else pairs(items)), end
    if code == 0x81:
        return I64.unpack_from(buf, pos + 1)[0], pos + 9
    if code == 0x83:
        return Timestamp(I64.unpack_from(buf, pos + 1)[0]), pos + 9
    if code == 0x55:
        return _I8.unpack_from(buf, pos + 1)[0], pos + 2
    if code == 0x41 or code == 0x42:
        return code == 0x41, pos + 1
    if code == 0x82:
        return _F64.unpack_from(buf, pos + 1)[0], pos + 9
    reader = _OTHERS.get(code)
    if reader is not None:
        return reader(buf, pos)
    decoded, end = decode(buf, pos)
    return cast("Field", decoded), end


# Reads the value at an offset: what it is and where it ends.
_Reader: TypeAlias = Callable[[bytes, int], tuple[Field, int]]


def _variable32(buf: bytes, pos: int) -> tuple[Field, int]:
    """A vbin32, str32 or sym32."""
    code = buf[pos]
    end = pos + 5 + U32.unpack_from(buf, pos + 1)[0]
    if code == 0xB0:
        return buf[pos + 5 : end], end
    if end > len(buf):
        raise DecodeError("a string runs past the end of the message")
    text = buf[pos + 5 : end].decode()
    return (text if code == 0xB1 else Symbol(text)), end


def _compound32(buf: bytes, pos: int) -> tuple[Field, int]:
    """A list32 or map32."""
    end = pos + 5 + U32.unpack_from(buf, pos + 1)[0]
    items = read_items(buf, pos + 9, end, U32.unpack_from(buf, pos + 5)[0])
    return (items if buf[pos] == 0xD0 else pairs(items)), end


def _uuid(buf: bytes, pos: int) -> tuple[Field, int]:
    if pos + 17 > len(buf):
        raise DecodeError("a uuid runs past the end of the message")
    return uuid.UUID(bytes=buf[pos + 1 : pos + 17]), pos + 17


def _described(buf: bytes, pos: int) -> tuple[Field, int]:
    descriptor, value_pos = read_value(buf, pos + 1)
    value, end = read_value(buf, value_pos)
    return Described(cast("Value", descriptor), cast("Value", value)), end


def _char(buf: bytes, pos: int) -> str:
    code_point = U32.unpack_from(buf, pos)[0]
    try:
        return chr(code_point)
    except ValueError:
        raise DecodeError(f"char U+{code_point:X} is not a Unicode code point") from None


# The rarer encodings by constructor; an unsigned ubyte or ushort is the next wider signed type.
_OTHERS: Final[dict[int, _Reader]] = {
    0x45: lambda buf, pos: ([], pos + 1),
    0x43: lambda buf, pos: (0, pos + 1),
    0x44: lambda buf, pos: (0, pos + 1),
    0x52: lambda buf, pos: (buf[pos + 1], pos + 2),
    0x53: lambda buf, pos: (buf[pos + 1], pos + 2),
    0x54: lambda buf, pos: (Int(_I8.unpack_from(buf, pos + 1)[0]), pos + 2),
    0x51: lambda buf, pos: (Byte(_I8.unpack_from(buf, pos + 1)[0]), pos + 2),
    0x50: lambda buf, pos: (Short(buf[pos + 1]), pos + 2),
    0x56: lambda buf, pos: (buf[pos + 1] != 0, pos + 2),
    0x71: lambda buf, pos: (Int(_I32.unpack_from(buf, pos + 1)[0]), pos + 5),
    0x70: lambda buf, pos: (U32.unpack_from(buf, pos + 1)[0], pos + 5),
    0x80: lambda buf, pos: (_U64.unpack_from(buf, pos + 1)[0], pos + 9),
    0x72: lambda buf, pos: (Float32(_F32.unpack_from(buf, pos + 1)[0]), pos + 5),
    0x60: lambda buf, pos: (Int(_U16.unpack_from(buf, pos + 1)[0]), pos + 3),
    0x61: lambda buf, pos: (Short(_I16.unpack_from(buf, pos + 1)[0]), pos + 3),
    0x73: lambda buf, pos: (_char(buf, pos + 1), pos + 5),
    0x98: _uuid,
    0xB0: _variable32,
    0xB1: _variable32,
    0xB3: _variable32,
    0xD0: _compound32,
    0xD1: _compound32,
    0x74: read_decimal,
    0x84: read_decimal,
    0x94: read_decimal,
    0x00: _described,
}


def read_items(buf: bytes, pos: int, end: int, count: int) -> list[Field]:
    """A list's or map's ``count`` items from ``pos``, within ``end``."""
    if end > len(buf):
        raise DecodeError("a compound value runs past the end of the message")
    items: list[Field] = []
    append = items.append
    for _ in range(count):
        if pos >= end:
            raise DecodeError("a compound value has fewer items than its count")
        value, pos = read_value(buf, pos)
        append(value)
    if pos > end:
        raise DecodeError("an item runs past the end of its compound value")
    return items


def pairs(items: list[Field]) -> dict[Field, Field]:
    """A map's items as a dict."""
    if len(items) % 2:
        raise DecodeError("a map has an odd number of items")
    keys = items[0::2]
    for key in keys:
        if isinstance(key, list | dict):
            raise DecodeError("a map key is a compound value")
    return dict(zip(keys, items[1::2], strict=True))


def compound_head(buf: bytes, pos: int, small: int) -> tuple[int, int, int] | None:
    """A list's or map's count of items, where its first starts and where it ends, if it has
    the constructor ``small`` (list8, map8) or its 32-bit form; None if it has another."""
    constructor = buf[pos]
    if constructor == small:
        return buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    if constructor == small + 0x10:
        end = pos + 5 + U32.unpack_from(buf, pos + 1)[0]
        return U32.unpack_from(buf, pos + 5)[0], pos + 9, end
    return None


def map_head(buf: bytes, pos: int, section: str) -> tuple[int, int, int] | None:
    """A map's number of entries, where its first starts and where it ends; None if null."""
    if buf[pos] == 0x40:
        return None
    head = compound_head(buf, pos, 0xC1)
    if head is None:
        raise DecodeError(f"the {section} section is not a map")
    count, item, end = head
    if count % 2:
        raise DecodeError("a map has an odd number of items")
    if end > len(buf):
        raise DecodeError(f"the {section} run past the end of the message")
    return count // 2, item, end


def read_map(buf: bytes, pos: int, section: str) -> tuple[dict[Field, Field] | None, int]:
    """An annotations map, or application properties without their known keys."""
    head = map_head(buf, pos, section)
    if head is None:
        return None, pos + 1
    entries, item, end = head
    result: dict[Field, Field] = {}
    item = read_entries(buf, item, entries, result)
    if item > end:
        raise DecodeError(f"the {section} run past their section")
    return result, end


def read_entries(buf: bytes, item: int, entries: int, result: dict[Field, Field]) -> int:
    """Add a map's next ``entries`` to ``result``, string and symbol keys inline; where they end."""
    key: Field
    value: Field
    for _ in range(entries):
        code = buf[item]
        if code == 0xA1 or code == 0xA3:
            key_end = item + 2 + buf[item + 1]
            key = buf[item + 2 : key_end].decode()
            if code == 0xA3:
                key = Symbol(key)
            item = key_end
        else:
            key, item = read_value(buf, item)
            if isinstance(key, list | dict):
                raise DecodeError("a map key is a compound value")
        # The values application properties mostly hold, inline; the rest by read_value.
        code = buf[item]
        if code == 0xA1:
            value_end = item + 2 + buf[item + 1]
            value = buf[item + 2 : value_end].decode()
            item = value_end
        elif code == 0x81:
            value = I64.unpack_from(buf, item + 1)[0]
            item += 9
        elif code == 0x55:
            value = _I8.unpack_from(buf, item + 1)[0]
            item += 2
        elif code == 0x41 or code == 0x42:
            value = code == 0x41
            item += 1
        elif code == 0x82:
            value = _F64.unpack_from(buf, item + 1)[0]
            item += 9
        else:
            value, item = read_value(buf, item)
        result[key] = value
    return item
