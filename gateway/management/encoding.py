"""Management replies encoded by the server's codec, with RabbitMQ's types and proton's.

``proton.Data`` indexes its nodes with 16-bit numbers: a reply of more than about 65,000 values
(2,500 queue maps) failed to encode with ``DataException [-10]``, and building a reply value by
value through the binding cost more than gathering the listing itself. Replies are maps, lists
and a few scalar types, so :func:`sluicegate.wire.encoding.encode_value` encodes them, each with the
AMQP type proton would give it (a plain ``int`` is a long, the wrappers ``ULong`` and ``UInt``
RabbitMQ's counts, ``Utf8Array`` RabbitMQ's array of utf8), and this module adds what only
management needs: booleans as RabbitMQ writes them, proton's own types as their AMQP types,
``Arguments`` each value as RabbitMQ echoes it; a value of a rarer proton type (one a client sent
in a declaration: an array, a decimal, a char) is small and is encoded by proton on its own.
The message's properties and application-properties are encoded by proton too, and the body
follows them as an amqp-value section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

from proton import (
    Array,
    Data,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)
from proton import Described as ProtonDescribed

from sluicegate.gateway.rules.management.requests import Arguments
from sluicegate.wire.amqp_types import Symbol, Timestamp, UInt, ULong
from sluicegate.wire.encoding import encode_value

# amqp-value (AMQP 1.0 §3.2.7): descriptor 0x77 as a smallulong.
AMQP_VALUE: Final = b"\x00\x53\x77"


def encode_reply_value(value: object) -> bytes:
    """One value of a reply, encoded as RabbitMQ (and proton) would encode it."""
    return encode_value(value, _RABBITMQ)


def _by_proton(value: object) -> bytes:
    data = Data()
    data.put_object(value)
    encoded: bytes = data.encode()
    return encoded


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


def _arguments(value: object) -> bytes:
    arguments = cast(Arguments, value)
    return encode_reply_value({key: rabbitmq_argument(item) for key, item in arguments.items()})


_RABBITMQ: Final[dict[type, Callable[[object], bytes]]] = {
    # RabbitMQ's replies carry {boolean, B}, which its generator writes 0x56 0x01/0x00, not the
    # one-byte true/false: RabbitMQ's JavaScript client (rhea) reads 0x56 as 1/0 and compares
    # durable, auto_delete and exclusive with 1.
    bool: lambda value: b"\x56\x01" if value else b"\x56\x00",
    symbol: lambda value: encode_value(Symbol(cast(str, value))),
    ulong: lambda value: encode_value(ULong(cast(int, value))),
    uint: lambda value: encode_value(UInt(cast(int, value))),
    timestamp: lambda value: encode_value(Timestamp(cast(int, value))),
    Arguments: _arguments,
    **dict.fromkeys(
        (
            Array,
            ProtonDescribed,
            byte,
            char,
            decimal32,
            decimal64,
            decimal128,
            float32,
            int32,
            short,
            ubyte,
            ushort,
        ),
        _by_proton,
    ),
}
