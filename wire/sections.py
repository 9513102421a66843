"""Reading and rewriting a message's leading sections without touching its body (AMQP 1.0 §3.2).

The server keeps each message as the bytes its publisher sent. Only a redelivery after a failed
attempt changes those bytes: the header's delivery-count goes up (§3.2.1), so the header section
is re-encoded and the rest of the message is reused as it is. Every reader of sections walks
them with :func:`iter_sections`, which finds where each section starts and ends without
decoding its value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final, TypeAlias

from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.decoding import decode, skip
from sluicegate.wire.encoding import encode, encode_ubyte, encode_uint
from sluicegate.wire.errors import DecodeError

HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74
# The first body section's code (data; amqp-sequence is 0x76, amqp-value 0x77, footer 0x78).
BODY: Final = 0x75
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


# The header of a message that has none.
DEFAULT_HEADER: Final = Header()


def section_code(descriptor: Value) -> int:
    """Return the numeric section code of a section descriptor, or -1 if it names no section."""
    if isinstance(descriptor, Symbol):
        return _SYMBOLIC.get(descriptor, -1)
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return descriptor
    return -1


# A section's code, where it starts, where its value starts and where it ends.
SectionSpan: TypeAlias = tuple[int, int, int, int]


def iter_sections(payload: bytes | memoryview, until: int = BODY) -> Iterator[SectionSpan]:
    """Each leading section as ``(code, start, value_at, end)``, its value skipped, not decoded.

    Stops before the first section whose code is ``until`` or more (by default the body), so
    the body is never reached. Descriptors are nearly always small ulongs (``00 53 xx``), read
    directly; any other goes through the codec, and one that names no section has code -1.
    """
    pos = 0
    size = len(payload)
    while pos < size:
        if payload[pos] != 0x00:
            raise DecodeError("a message section is not a described value")
        if pos + 2 < size and payload[pos + 1] == 0x53:
            code = payload[pos + 2]
            value_at = pos + 3
        else:
            descriptor, value_at = decode(payload, pos + 1)
            code = section_code(descriptor)
        if code >= until:
            return
        end = skip(payload, value_at)
        yield code, pos, value_at, end
        pos = end


def head_size(payload: bytes | memoryview) -> int:
    """The bytes of the sections before the body, found without decoding them: what reading
    a message's headers or annotations may decode."""
    return max((end for *_, end in iter_sections(payload)), default=0)


def sections(payload: bytes | memoryview, until: int = BODY) -> list[tuple[int, Value, int, int]]:
    """Decode the sections before ``until`` (by default the body): ``(code, value, start, end)``."""
    return [
        (code, decode(payload, value_at)[0], start, end)
        for code, start, value_at, end in iter_sections(payload, until)
    ]


def _header_span(payload: bytes | memoryview) -> tuple[int, int] | None:
    """Where the header's value starts and where the section ends, if the message has one.

    The header is the first section when present (§3.2); bytes that are no section at all
    have none.
    """
    if not payload or payload[0] != 0x00:
        return None
    for code, _, value_at, end in iter_sections(payload, DELIVERY_ANNOTATIONS):
        return (value_at, end) if code == HEADER else None
    return None


def read_header(payload: bytes | memoryview) -> Header:
    """Return the message's header fields; a message without a header has the defaults."""
    span = _header_span(payload)
    if span is None:
        return DEFAULT_HEADER
    return header_from(decode(payload, span[0])[0])


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
    return shared_header(
        _boolean("durable", durable),
        4 if priority is None else _unsigned("priority", priority, _UBYTE_MAX),
        None if ttl is None else _unsigned("ttl", ttl, _UINT_MAX),
        _boolean("first-acquirer", first_acquirer),
        0 if delivery_count is None else _unsigned("delivery-count", delivery_count, _UINT_MAX),
    )


@lru_cache(maxsize=1024)
def shared_header(
    durable: bool, priority: int, ttl: int | None, first_acquirer: bool, delivery_count: int
) -> Header:
    """One object for equal headers: every message keeps its header, and most are alike."""
    return Header(durable, priority, ttl, first_acquirer, delivery_count)


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
    span = _header_span(payload)
    header = DEFAULT_HEADER if span is None else header_from(decode(payload, span[0])[0])
    rest = 0 if span is None else span[1]
    return encode_header(replace(header, delivery_count=delivery_count)) + payload[rest:]


__all__ = [
    "APPLICATION_PROPERTIES",
    "BODY",
    "DEFAULT_HEADER",
    "DELIVERY_ANNOTATIONS",
    "HEADER",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "Described",
    "Header",
    "encode",
    "encode_header",
    "header_from",
    "iter_sections",
    "read_header",
    "section_code",
    "sections",
    "with_delivery_count",
]
