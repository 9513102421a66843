"""The message-annotations section every delivery carries, spliced in without touching the body.

RabbitMQ puts a message-annotations section on every message it delivers, with the exchange and
routing key it was published to (``x-exchange``, ``x-routing-key``), and RabbitMQ's AMQP 1.0
clients rely on the section being there. A message that arrives
without one gets it inserted where AMQP 1.0 §3.2 puts it, after the header and delivery
annotations; the bytes before and after are copied as they are, so the body is never decoded.
A message that already has the section keeps its own.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Final

from sluicegate.wire.codec import Symbol, decode, encode
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import (
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    iter_sections,
)

_MA_PREFIX: Final = b"\x00\x53\x72"
X_EXCHANGE: Final = Symbol("x-exchange")
X_ROUTING_KEY: Final = Symbol("x-routing-key")
# Each message of a stream carries its offset here (RabbitMQ's x-stream-offset, a long).
X_STREAM_OFFSET: Final = Symbol("x-stream-offset")
# A publisher's tag for stream filtering (RabbitMQ 4.1's x-stream-filter-value, a string).
X_STREAM_FILTER_VALUE: Final = Symbol("x-stream-filter-value")
_LONG = struct.Struct(">q")


@lru_cache(maxsize=4096)
def routing_annotations(exchange: str, routing_key: str) -> bytes:
    """The encoded section ``{x-exchange, x-routing-key}``; cached, as few pairs recur."""
    return _MA_PREFIX + encode({X_EXCHANGE: exchange, X_ROUTING_KEY: routing_key})


def _annotations(payload: bytes | memoryview) -> tuple[int, int, int] | int:
    """The message-annotations section's start, value and end; or where it belongs (AMQP 1.0
    §3.2: after the header and delivery annotations) if the message has none."""
    pos = 0
    for code, start, value_at, end in iter_sections(payload, until=PROPERTIES):
        if code == MESSAGE_ANNOTATIONS:
            return start, value_at, end
        if code not in (HEADER, DELIVERY_ANNOTATIONS):
            return start
        pos = end
    return pos


def annotations_offset(payload: bytes | memoryview) -> int | None:
    """Where a message-annotations section belongs, or None if the message has one."""
    found = _annotations(payload)
    return found if isinstance(found, int) else None


def with_routing_annotations(payload: bytes, exchange: str, routing_key: str) -> bytes:
    """``payload`` with a message-annotations section, adding one if it has none."""
    offset = annotations_offset(payload)
    if offset is None:
        return payload
    return payload[:offset] + routing_annotations(exchange, routing_key) + payload[offset:]


def _encode_annotations(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(key + value for key, value in entries)
    count = 2 * len(entries)
    if len(body) + 1 < 256 and count < 256:
        return _MA_PREFIX + bytes((0xC1, len(body) + 1, count)) + body
    return _MA_PREFIX + b"\xd1" + struct.pack(">II", len(body) + 4, count) + body


def with_stream_offset(payload: bytes, offset: int) -> bytes:
    """``payload`` with ``x-stream-offset`` (a long) in its message annotations."""
    return stamp_stream_offset(payload, offset)[0]


def stamp_stream_offset(payload: bytes, offset: int) -> tuple[bytes, str | None]:
    """``payload`` with ``x-stream-offset`` (a long) in its message annotations, and the
    message's ``x-stream-filter-value`` if it has one, read in the same pass.

    The annotations section is re-encoded (or inserted after the header and delivery
    annotations, AMQP 1.0 §3.2); the bytes around it are copied as they are.
    """
    stamp = (encode(X_STREAM_OFFSET), b"\x81" + _LONG.pack(offset))
    found = _annotations(payload)
    if isinstance(found, int):
        return payload[:found] + _encode_annotations([stamp]) + payload[found:], None
    start, value_at, end = found
    value, _ = decode(payload, value_at)
    if not isinstance(value, dict):
        raise DecodeError("the message-annotations section is not a map")
    entries = [(encode(k), encode(v)) for k, v in value.items() if k != X_STREAM_OFFSET]
    stamped = payload[:start] + _encode_annotations([*entries, stamp]) + payload[end:]
    filter_value = value.get(X_STREAM_FILTER_VALUE)
    return stamped, filter_value if isinstance(filter_value, str) else None


def read_stream_offset(payload: bytes | memoryview) -> int | None:
    """The ``x-stream-offset`` a stamped message carries, or None."""
    found = _annotations(payload)
    if isinstance(found, int):
        return None
    value, _ = decode(payload, found[1])
    offset = value.get(X_STREAM_OFFSET) if isinstance(value, dict) else None
    return offset if isinstance(offset, int) else None
