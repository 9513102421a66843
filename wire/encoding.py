"""Writing AMQP 1.0 values (AMQP 1.0 §1): the encoding half of the server's one codec.

Two encoders share its primitives and the wrappers of :mod:`sluicegate.wire.amqp_types`:
:func:`encode` writes what the server rewrites (a plain ``int`` in its smallest unsigned form,
as its logs and binding identities have always been written); :func:`encode_value` writes a
value with the type a client means by it (a plain ``int`` a long), for management replies and
the Spark connector, with a table of the caller's own types to take first.
:mod:`sluicegate.wire.decoding` is the reading half.
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
from sluicegate.wire.errors import EncodeError

# Big-endian packers, bound once: encoding runs per message on the server's rewrites.
_pack_u8 = struct.Struct(">B").pack
_pack_u32 = struct.Struct(">I").pack
_pack_u64 = struct.Struct(">Q").pack
_pack_i8 = struct.Struct(">b").pack
_pack_i16 = struct.Struct(">h").pack
_pack_i32 = struct.Struct(">i").pack
_pack_i64 = struct.Struct(">q").pack
_pack_f32 = struct.Struct(">f").pack
_pack_f64 = struct.Struct(">d").pack


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
            return b"\x55" + _pack_i8(value) if value >= -128 else b"\x81" + _pack_i64(value)
        if value == 0:
            return b"\x44"
        if value < 256:
            return b"\x53" + _pack_u8(value)
        return b"\x80" + _pack_u64(value)
    if isinstance(value, float):
        return b"\x72" + _pack_f32(value) if type(value) is Float32 else b"\x82" + _pack_f64(value)
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
        return b"\x52" + _pack_u8(value)
    return b"\x70" + _pack_u32(value)


def encode_ulong(value: int) -> bytes:
    """Encode an AMQP ulong in its smallest form."""
    if value == 0:
        return b"\x44"
    return b"\x53" + _pack_u8(value) if value < 256 else b"\x80" + _pack_u64(value)


def encode_ubyte(value: int) -> bytes:
    """Encode an AMQP ubyte (the header's priority)."""
    return b"\x50" + _pack_u8(value)


def encode_variable(raw: bytes, small: int, large: int) -> bytes:
    """A variable-width value: its ``small`` (1-byte size) or ``large`` (4-byte) constructor."""
    if len(raw) < 256:
        return bytes((small, len(raw))) + raw
    return bytes((large,)) + _pack_u32(len(raw)) + raw


def encode_compound(body: bytes, count: int, small: int, large: int) -> bytes:
    """A list or map of ``count`` encoded elements: its ``small`` or ``large`` constructor."""
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((large,)) + _pack_u32(len(body) + 4) + _pack_u32(count) + body


# The integer wrappers, each written as its type; a Timestamp is an integer too.
_SIZED_INTS: Final[dict[type, Callable[[int], bytes]]] = {
    Timestamp: lambda value: b"\x83" + _pack_i64(value),
    Byte: lambda value: b"\x51" + _pack_i8(value),
    Short: lambda value: b"\x61" + _pack_i16(value),
    Int: lambda value: b"\x71" + _pack_i32(value),
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
        return b"\x72" + _pack_f32(value) if type(value) is Float32 else b"\x82" + _pack_f64(value)
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
        return b"\x55" + _pack_i8(value)
    if -(1 << 63) <= value < 1 << 63:
        return b"\x81" + _pack_i64(value)
    if 0 <= value < 1 << 64:
        return b"\x80" + _pack_u64(value)  # a ulong (what a read gives for one)
    raise EncodeError(f"{value} fits no AMQP integer type")


def _utf8_array(value: list[str]) -> bytes:
    """An array of utf8 as RabbitMQ's generator frames it: each element str32 (0xB1)."""
    body = b"\xb1" + b"".join(_pack_u32(len(raw)) + raw for raw in (v.encode() for v in value))
    if len(value) < 255 and len(body) + 1 < 256:
        return bytes((0xE0, len(body) + 1, len(value))) + body
    return b"\xf0" + _pack_u32(len(body) + 4) + _pack_u32(len(value)) + body
