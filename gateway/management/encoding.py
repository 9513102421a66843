"""Management replies encoded without building them in proton's ``Data``.

``proton.Data`` indexes its nodes with 16-bit numbers: a reply of more than about 65,000 values
(2,500 queue maps) failed to encode with ``DataException [-10]``, and building a reply value by
value through the binding cost more than gathering the listing itself. Replies are maps, lists
and a few scalar types, so this module encodes those directly, each with the AMQP type proton
would give it (a plain ``int`` is a long, the router's ``ULong`` and ``UInt`` RabbitMQ's counts,
its ``Utf8Array`` RabbitMQ's array of utf8, its ``Arguments`` each value as RabbitMQ echoes it);
a value of any other type (one a client sent in a declaration: an array, a decimal, a uuid) is
small and is encoded by proton on its own. The message's properties and application-properties
are encoded by proton too, and the body follows them as an amqp-value section.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, cast

from proton import Data, symbol, timestamp, uint, ulong

from sluicegate.gateway.rules.management.requests import Arguments, UInt, ULong, Utf8Array
from sluicegate.wire.codec import encode_compound, encode_uint, encode_variable

# amqp-value (AMQP 1.0 §3.2.7): descriptor 0x77 as a smallulong.
AMQP_VALUE: Final = b"\x00\x53\x77"

_U8 = struct.Struct(">B")
_I8 = struct.Struct(">b")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


def encode_value(value: object) -> bytes:
    """One value, encoded as proton would encode it."""
    encoder = _ENCODERS.get(type(value))
    if encoder is not None:
        return encoder(value)
    data = Data()
    data.put_object(value)
    encoded: bytes = data.encode()
    return encoded


def _long(value: int) -> bytes:
    return b"\x55" + _I8.pack(value) if -128 <= value <= 127 else b"\x81" + _I64.pack(value)


def _ulong(value: int) -> bytes:
    if value == 0:
        return b"\x44"
    return b"\x53" + _U8.pack(value) if value < 256 else b"\x80" + _U64.pack(value)


def _list(value: list[object]) -> bytes:
    if not value:
        return b"\x45"
    return encode_compound(b"".join(map(encode_value, value)), len(value), 0xC0, 0xD0)


def _map(value: dict[object, object]) -> bytes:
    body = b"".join(encode_value(key) + encode_value(item) for key, item in value.items())
    return encode_compound(body, 2 * len(value), 0xC1, 0xD1)


def _utf8_array(value: list[str]) -> bytes:
    """An array of utf8 as RabbitMQ's generator frames it: each element str32 (0xB1)."""
    body = b"\xb1" + b"".join(_U32.pack(len(raw)) + raw for raw in (v.encode() for v in value))
    if len(value) < 255 and len(body) + 1 < 256:
        return bytes((0xE0, len(body) + 1, len(value))) + body
    return b"\xf0" + _U32.pack(len(body) + 4) + _U32.pack(len(value)) + body


def rabbitmq_argument(value: object) -> object:
    """An argument as RabbitMQ gives it back after keeping it in an AMQP 0-9-1 field table
    (``mc_amqpl:to_091`` then ``from_091``): a symbol comes back as a string, a ulong as a
    long, a timestamp to the second, a map with symbol keys, list items likewise."""
    kind = type(value)
    if kind is symbol:
        return str(value)
    if kind is ulong:
        return int(value)  # type: ignore[call-overload]
    if kind is timestamp:
        return timestamp(cast(int, value) // 1000 * 1000)
    if kind is list:
        return [rabbitmq_argument(item) for item in cast(list[object], value)]
    if kind is dict:
        return {
            symbol(key) if isinstance(key, str) else key: rabbitmq_argument(item)
            for key, item in cast(dict[object, object], value).items()
        }
    return value


def _arguments(value: dict[str, object]) -> bytes:
    return _map({key: rabbitmq_argument(item) for key, item in value.items()})


_ENCODERS: Final[dict[type, Callable[[object], bytes]]] = {
    type(None): lambda value: b"\x40",
    # RabbitMQ's replies carry {boolean, B}, which its generator writes 0x56 0x01/0x00, not the
    # one-byte true/false: RabbitMQ's JavaScript client (rhea) reads 0x56 as 1/0 and compares
    # durable, auto_delete and exclusive with 1.
    bool: lambda value: b"\x56\x01" if value else b"\x56\x00",
    int: _long,  # type: ignore[dict-item]
    ULong: _ulong,  # type: ignore[dict-item]
    ulong: _ulong,  # type: ignore[dict-item]
    UInt: encode_uint,  # type: ignore[dict-item]
    uint: encode_uint,  # type: ignore[dict-item]
    float: lambda value: b"\x82" + _F64.pack(value),
    str: lambda value: encode_variable(value.encode(), 0xA1, 0xB1),  # type: ignore[attr-defined]
    symbol: lambda value: encode_variable(value.encode(), 0xA3, 0xB3),  # type: ignore[attr-defined]
    bytes: lambda value: encode_variable(value, 0xA0, 0xB0),  # type: ignore[arg-type]
    list: _list,  # type: ignore[dict-item]
    dict: _map,  # type: ignore[dict-item]
    Utf8Array: _utf8_array,  # type: ignore[dict-item]
    Arguments: _arguments,  # type: ignore[dict-item]
}
