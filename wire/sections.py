"""Reading and rewriting a message's leading sections without touching its body (AMQP 1.0 §3.2).

The server keeps each message as the bytes its publisher sent. Only a redelivery after a failed
attempt changes those bytes: the header's delivery-count goes up (§3.2.1), so the header section
is re-encoded and the rest of the message is reused as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluicegate.wire.codec import (
    Described,
    Symbol,
    Value,
    decode,
    encode,
    encode_ubyte,
    encode_uint,
)
from sluicegate.wire.errors import DecodeError

HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74
# Sections may also be described by their symbolic names (§3.2).
_SYMBOLIC: Final = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76,
    "amqp:amqp-value:*": 0x77,
    "amqp:footer:map": 0x78,
}
# The header of a message that has none: every field takes its default (§3.2.1).
_HEADER_PREFIX: Final = b"\x00\x53\x70"


@dataclass(frozen=True, slots=True)
class Header:
    """The header fields a broker acts on (§3.2.1), with the spec's defaults."""

    durable: bool = False
    priority: int = 4
    ttl: int | None = None
    first_acquirer: bool = False
    delivery_count: int = 0


def section_code(descriptor: Value) -> int:
    """Return the numeric section code of a section descriptor, or -1 if it names no section."""
    if isinstance(descriptor, Symbol):
        return _SYMBOLIC.get(descriptor, -1)
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return descriptor
    return -1


def sections(payload: bytes | memoryview, until: int = 0x75) -> list[tuple[int, Value, int, int]]:
    """Decode the sections before the body: ``(code, value, start, end)`` for each.

    Stops at the first section whose code is ``until`` or more (by default the body), so the
    body is never decoded.
    """
    found: list[tuple[int, Value, int, int]] = []
    pos = 0
    size = len(payload)
    while pos < size:
        if payload[pos] != 0x00:
            raise DecodeError("a message section is not a described value")
        descriptor, value_pos = decode(payload, pos + 1)
        code = section_code(descriptor)
        if code >= until:
            break
        value, end = decode(payload, value_pos)
        found.append((code, value, pos, end))
        pos = end
    return found


def read_header(payload: bytes | memoryview) -> Header:
    """Return the message's header fields; a message without a header has the defaults."""
    if not payload or payload[0] != 0x00:
        return Header()
    descriptor, value_pos = decode(payload, 1)
    if section_code(descriptor) != HEADER:
        return Header()
    value, _ = decode(payload, value_pos)
    return header_from(value)


_UBYTE_MAX: Final = 0xFF
_UINT_MAX: Final = 0xFFFFFFFF


def header_from(value: Value) -> Header:
    """Read the header's fields, refusing values their AMQP types cannot hold.

    The header is re-encoded on redelivery, so a value that would not encode back (a priority of
    1000, a negative ttl) is refused when the message is read, not when it is redelivered.
    """
    if not isinstance(value, list):
        raise DecodeError("the header section is not a list")
    fields = [*value, None, None, None, None, None][:5]
    durable, priority, ttl, first_acquirer, delivery_count = fields
    return Header(
        durable=_boolean("durable", durable),
        priority=4 if priority is None else _unsigned("priority", priority, _UBYTE_MAX),
        ttl=None if ttl is None else _unsigned("ttl", ttl, _UINT_MAX),
        first_acquirer=_boolean("first-acquirer", first_acquirer),
        delivery_count=(
            0 if delivery_count is None else _unsigned("delivery-count", delivery_count, _UINT_MAX)
        ),
    )


def _boolean(name: str, value: Value) -> bool:
    if value is None or isinstance(value, bool):
        return value is True
    raise DecodeError(f"the header's {name} is not a boolean")


def _unsigned(name: str, value: Value, maximum: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum:
        return value
    raise DecodeError(f"the header's {name} is not an unsigned integer up to {maximum}")


def encode_header(header: Header) -> bytes:
    """Encode a header section, dropping trailing fields that hold their defaults (§1.4)."""
    fields = [
        b"\x41" if header.durable else b"\x42",
        encode_ubyte(header.priority),
        b"\x40" if header.ttl is None else encode_uint(header.ttl),
        b"\x41" if header.first_acquirer else b"\x42",
        encode_uint(header.delivery_count),
    ]
    defaults = [b"\x42", encode_ubyte(4), b"\x40", b"\x42", b"\x43"]
    while fields and fields[-1] == defaults[len(fields) - 1]:
        fields.pop()
    body = b"".join(fields)
    if not fields:
        return _HEADER_PREFIX + b"\x45"
    return _HEADER_PREFIX + bytes((0xC0, len(body) + 1, len(fields))) + body


def with_delivery_count(payload: bytes, delivery_count: int) -> bytes:
    """Return ``payload`` with its header's delivery-count set, inserting a header if absent."""
    header = Header()
    rest = 0
    if payload and payload[0] == 0x00:
        descriptor, value_pos = decode(payload, 1)
        if section_code(descriptor) == HEADER:
            value, rest = decode(payload, value_pos)
            header = header_from(value)
    updated = Header(
        durable=header.durable,
        priority=header.priority,
        ttl=header.ttl,
        first_acquirer=header.first_acquirer,
        delivery_count=delivery_count,
    )
    return encode_header(updated) + payload[rest:]


__all__ = [
    "APPLICATION_PROPERTIES",
    "DELIVERY_ANNOTATIONS",
    "HEADER",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "Described",
    "Header",
    "encode",
    "encode_header",
    "header_from",
    "read_header",
    "section_code",
    "sections",
    "with_delivery_count",
]
