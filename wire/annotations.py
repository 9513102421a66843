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

from sluicegate.wire.amqp_types import Symbol, Value
from sluicegate.wire.decoding import decode, skip
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import AmqpError, DecodeError
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


def filter_value_of(value: object) -> str | None:
    """A message's stream filter value from its annotation's value: a non-empty string, or
    None for a message without one. An empty string is none too: RabbitMQ's streams file a
    message tagged ``""`` with the unfiltered ones, so ``match-unfiltered`` readers get it."""
    return value if isinstance(value, str) and value else None


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


def _encode_map(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A map of already encoded keys and values."""
    body = b"".join(key + value for key, value in entries)
    count = 2 * len(entries)
    if len(body) + 1 < 256 and count < 256:
        return bytes((0xC1, len(body) + 1, count)) + body
    return b"\xd1" + struct.pack(">II", len(body) + 4, count) + body


def _encode_annotations(entries: list[tuple[bytes, bytes]]) -> bytes:
    return _MA_PREFIX + _encode_map(entries)


def stamp_stream_offset(payload: bytes, offset: int) -> tuple[bytes, str | None]:
    """``payload`` with ``x-stream-offset`` (a long) in its message annotations, and the
    message's ``x-stream-filter-value`` if it has one, read in the same pass.

    The annotations section is re-encoded (or inserted after the header and delivery
    annotations, AMQP 1.0 §3.2); the bytes around it are copied as they are. The offset is the
    section's last 8 bytes, so the section up to them is made once per distinct section.
    """
    stamp = _LONG.pack(offset)
    found = _annotations(payload)
    if isinstance(found, int):
        return b"".join((payload[:found], _OFFSET_ONLY, stamp, payload[found:])), None
    start, value_at, end = found
    section = bytes(payload[value_at:end])
    stamped = _STAMPED.get(section)
    if stamped is None:
        stamped = _stamped_section(section)
        if len(section) <= _STAMPED_SECTION_MAX:
            if len(_STAMPED) >= _STAMPED_MAX:
                _STAMPED.clear()
            _STAMPED[section] = stamped
    head, filter_value = stamped
    return b"".join((payload[:start], head, stamp, payload[end:])), filter_value


def _stamped_section(section: bytes) -> tuple[bytes, str | None]:
    """The message-annotations section that replaces ``section`` (the encoded map), but for
    the offset's 8 bytes, and the filter value it holds."""
    value, _ = decode(section, 0)
    if not isinstance(value, dict):
        raise DecodeError("the message-annotations section is not a map")
    entries = [(encode(k), encode(v)) for k, v in value.items() if k != X_STREAM_OFFSET]
    encoded = _encode_annotations([*entries, _STAMP])
    return encoded[: -_LONG.size], filter_value_of(value.get(X_STREAM_FILTER_VALUE))


# The stamp's entry with a zero offset, and the section of a message without annotations up to
# its offset.
_STAMP: Final = (encode(X_STREAM_OFFSET), b"\x81" + bytes(_LONG.size))
_OFFSET_ONLY: Final = _encode_annotations([_STAMP])[: -_LONG.size]
# Stamped sections by the annotations they replace: a stream's publisher sends the same
# annotations message after message (most often none but the x-exchange/x-routing-key the
# router spliced in, gateway/rules/routing.py), so each is decoded and re-encoded once. Only small
# sections are kept (a few hundred bytes each at most), and few distinct ones: a publisher
# varying its annotations per message empties the table now and then, never grows it.
_STAMPED: Final[dict[bytes, tuple[bytes, str | None]]] = {}
_STAMPED_MAX: Final = 1024
_STAMPED_SECTION_MAX: Final = 256


def map_entries(buf: bytes | memoryview, pos: int = 0) -> list[tuple[Value, bytes, bytes]]:
    """The entries of the map encoded at ``pos``: each key, and the key's and value's bytes.

    Values stay encoded as they were, so re-encoding the map keeps every value's AMQP type.
    """
    code = buf[pos] if pos < len(buf) else None
    if code == 0xC1:
        _need_bytes(buf, pos + 3)
        count, start, end = buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    elif code == 0xD1:
        _need_bytes(buf, pos + 9)
        size, count = struct.unpack_from(">II", buf, pos + 1)
        start, end = pos + 9, pos + 5 + size
    else:
        raise DecodeError("message annotations must be a map")
    entries: list[tuple[Value, bytes, bytes]] = []
    at = start
    for _ in range(count // 2):
        key, key_end = decode(buf, at)
        value_end = skip(buf, key_end)
        entries.append((key, bytes(buf[at:key_end]), bytes(buf[key_end:value_end])))
        at = value_end
    if at != end:
        raise DecodeError("a map's entries do not fill it")
    return entries


def _need_bytes(buf: bytes | memoryview, end: int) -> None:
    if end > len(buf):
        raise DecodeError("a map runs past the end of its section")


def merge_annotations(payload: bytes, additions: bytes) -> bytes:
    """``payload`` with the entries of the encoded map ``additions`` in its message annotations.

    An entry replaces the message's entry of the same key; the others are kept, their values'
    bytes as they were (a consumer's ``modified`` outcome annotates a message so, as RabbitMQ
    4's quorum queues do). The body is never decoded.
    """
    added = map_entries(additions)
    if not added:
        return payload
    keys = {key for key, _, _ in added}
    found = _annotations(payload)
    new = [(k, v) for _, k, v in added]
    if isinstance(found, int):
        return payload[:found] + _encode_annotations(new) + payload[found:]
    start, value_at, end = found
    kept = [(k, v) for key, k, v in map_entries(payload, value_at) if key not in keys]
    return payload[:start] + _encode_annotations([*kept, *new]) + payload[end:]


class InvalidAnnotations(AmqpError):
    """A ``modified`` outcome whose annotations a message cannot take."""

    condition = "amqp:invalid-field"


class AnnotationsTooLarge(InvalidAnnotations):
    """A ``modified`` outcome whose annotations are larger than a message may carry."""

    condition = "amqp:link:message-size-exceeded"


def modified_annotations(encoded: bytes | None, limit: int | None = None) -> bytes | None:
    """The annotations of a consumer's ``modified`` outcome, checked; None when there are none.

    They must be a map with symbol keys starting with ``x-``: AMQP 1.0 §3.2.10 reserves every
    other symbolic key, and RabbitMQ takes only those; and at most ``limit`` bytes encoded (the
    server's ``max_message_annotations_size``), measured before anything is decoded.
    """
    if encoded is None:
        return None
    if limit is not None and len(encoded) > limit:
        raise AnnotationsTooLarge(
            f"modified outcome: message-annotations of {len(encoded)} bytes exceed "
            f"max_message_annotations_size {limit}"
        )
    try:
        entries = map_entries(encoded)
    except DecodeError as error:
        raise InvalidAnnotations(f"modified outcome: message-annotations: {error}") from None
    for key, _, _ in entries:
        if not isinstance(key, Symbol) or not key.startswith("x-"):
            raise InvalidAnnotations(
                f"modified outcome: message-annotations key {key!r} is not a symbol starting "
                "with 'x-'"
            )
    return encoded if entries else None


def merged_map(first: bytes, second: bytes) -> bytes:
    """Two encoded annotation maps as one: ``second``'s entries win, values' bytes kept."""
    added = map_entries(second)
    keys = {key for key, _, _ in added}
    kept = [(k, v) for key, k, v in map_entries(first) if key not in keys]
    return _encode_map([*kept, *((k, v) for _, k, v in added)])


def read_stream_offset(payload: bytes | memoryview) -> int | None:
    """The ``x-stream-offset`` a stamped message carries, or None."""
    found = _annotations(payload)
    if isinstance(found, int):
        return None
    value, _ = decode(payload, found[1])
    offset = value.get(X_STREAM_OFFSET) if isinstance(value, dict) else None
    return offset if isinstance(offset, int) else None
