"""What the server reads of a message when it is published: the envelope, never the body.

One pass over the leading sections at publish time validates them and picks out the few fields
routing and expiry need. The header must decode to one that can be re-encoded when its
delivery-count goes up. The annotation sections and application-properties must decode with the
codec as maps, within its limits (nesting depth, element counts): dead-lettering, filters,
headers exchanges and streams decode them later, so a message they could not read is refused at
the door with ``amqp:decode-error`` instead of failing in the pipeline after it was accepted.
The properties list is walked item by item only as far as ``absolute-expiry-time``, the size of
application-properties is measured by its width, and reading stops after it: the body is never
reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluicegate.wire.amqp_types import Symbol, Value
from sluicegate.wire.decoding import decode, scalar_map, skip
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import (
    APPLICATION_PROPERTIES,
    DEFAULT_HEADER,
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    Header,
    header_from,
    iter_sections,
)

# Positions in the properties list (AMQP 1.0 §3.2.4).
_TO: Final = 2
_SUBJECT: Final = 3
_ABSOLUTE_EXPIRY_TIME: Final = 8
# The message annotation naming more routing keys (RabbitMQ 4.1's sender-selected routing).
X_CC: Final = Symbol("x-cc")
# Its key, encoded: annotations of scalars without these bytes are checked, never decoded (a
# value that holds them only costs the decode).
_X_CC_ENCODED: Final = encode(X_CC)
# Headers read, by their encoded value: a publisher sends the same header (durable, priority,
# ttl) on message after message, so one decode serves them all. Distinct headers are few; the
# bound only keeps a publisher varying its ttl per message from growing the table.
_HEADERS: Final[dict[bytes, Header]] = {}
_HEADERS_MAX: Final = 256


def _width_table() -> tuple[int, ...]:
    """Each constructor's whole width (>0), or -1/-4 for a 1/4-byte size, or 0: not known here.

    AMQP 1.0 §1.6: the high nibble gives the encoding's category (fixed 0-16 bytes, or a 1- or
    4-byte size before the payload).
    """
    fixed = {0x4: 1, 0x5: 2, 0x6: 3, 0x7: 5, 0x8: 9, 0x9: 17}
    sized = {0xA: -1, 0xB: -4, 0xC: -1, 0xD: -4, 0xE: -1, 0xF: -4}
    return tuple(fixed.get(code >> 4, sized.get(code >> 4, 0)) for code in range(256))


_WIDTH: Final = _width_table()


def _end(buf: bytes | memoryview, pos: int) -> int:
    """Where the value at ``pos`` ends, found by its width alone (described ones by the codec)."""
    if pos >= len(buf):
        raise DecodeError("value runs past the end of the message")
    width = _WIDTH[buf[pos]]
    if width > 0:
        end = pos + width
    elif width == -1:
        end = pos + 2 + buf[pos + 1] if pos + 1 < len(buf) else len(buf) + 1
    elif width == -4:
        end = pos + 5 + int.from_bytes(buf[pos + 1 : pos + 5], "big")
    else:
        return skip(buf, pos)
    if end > len(buf):
        raise DecodeError("value runs past the end of the message")
    return end


@dataclass(slots=True)
class Envelope:
    """The fields of a published message the server acts on; read, never changed.

    Not frozen: one is made per published message, and a frozen dataclass's ``__init__`` costs
    five times as much (it sets each field through ``object.__setattr__``).
    """

    header: Header
    to: str | None = None
    subject: str | None = None
    # Milliseconds since the epoch, as AMQP timestamps are.
    absolute_expiry_time: int | None = None
    # Where a message-annotations section belongs (after the header and delivery
    # annotations), or None when the message has one.
    annotations_at: int | None = 0
    # Encoded bytes of the application-properties section's map (0: none).
    application_properties_size: int = 0
    # More routing keys from the ``x-cc`` message annotation (RabbitMQ 4.1).
    cc: tuple[str, ...] = ()
    # Encoded bytes of the message-annotations section's map (0: none).
    message_annotations_size: int = 0

    def expires(self, now: int) -> int | None:
        """When the message expires by its own ttl or absolute-expiry-time, if ever."""
        ttl = self.header.ttl
        deadline = None if ttl is None else now + ttl
        absolute = self.absolute_expiry_time
        if absolute is not None and absolute > 0 and (deadline is None or absolute < deadline):
            return absolute
        return deadline


def read_envelope(
    payload: bytes | memoryview,
    max_application_properties_size: int | None = None,
    max_message_annotations_size: int | None = None,
) -> Envelope:
    """Read the header and the routing/expiry properties; raise DecodeError if malformed.

    Application-properties larger than ``max_application_properties_size``, and
    message-annotations larger than ``max_message_annotations_size``, are measured, not
    decoded: the publish is refused. Annotations of scalars only, without an ``x-cc`` key, are
    checked without building a value.
    """
    header = DEFAULT_HEADER
    to: str | None = None
    subject: str | None = None
    absolute: int | None = None
    annotations_at: int | None = 0
    application_properties_size = 0
    cc: tuple[str, ...] = ()
    annotations_size = 0
    for code, _, value_at, end in iter_sections(payload):
        if code == HEADER:
            if payload[value_at] != 0x45:
                header = _header(bytes(payload[value_at:end]))
            annotations_at = end
        elif code == DELIVERY_ANNOTATIONS:
            if not scalar_map(payload, value_at, end):
                _map(payload, value_at, "delivery-annotations")
            annotations_at = end
        elif code == MESSAGE_ANNOTATIONS:
            annotations_at = None
            annotations_size = end - value_at
            limit = max_message_annotations_size
            if (limit is None or annotations_size <= limit) and (
                not scalar_map(payload, value_at, end)
                or _X_CC_ENCODED in bytes(payload[value_at:end])
            ):
                annotations = _map(payload, value_at, "message-annotations")
                if X_CC in annotations:
                    cc = _cc(annotations[X_CC])
        elif code == PROPERTIES:
            to, subject, absolute = _properties(payload, value_at, end)
        elif code == APPLICATION_PROPERTIES:
            application_properties_size = end - value_at
            # Over the limit the message is refused by its size: its map is never decoded.
            limit = max_application_properties_size
            if (limit is None or application_properties_size <= limit) and not scalar_map(
                payload, value_at, end
            ):
                _map(payload, value_at, "application-properties")
            break
        else:
            raise DecodeError(f"unknown message section 0x{code:x}")
    return Envelope(
        header,
        to,
        subject,
        absolute,
        annotations_at,
        application_properties_size,
        cc,
        annotations_size,
    )


def _header(encoded: bytes) -> Header:
    """The header an encoded header list gives (raising DecodeError), decoded once per kind."""
    header = _HEADERS.get(encoded)
    if header is None:
        header = header_from(decode(encoded, 0)[0])
        if len(_HEADERS) >= _HEADERS_MAX:
            _HEADERS.clear()
        _HEADERS[encoded] = header
    return header


def _map(payload: bytes | memoryview, pos: int, section: str) -> dict[Value, Value]:
    """Decode a map section as the pipeline will (raising DecodeError)."""
    value, _ = decode(payload, pos)
    if not isinstance(value, dict):
        raise DecodeError(f"the {section} section is not a map")
    return value


class InvalidCc(DecodeError):
    """An ``x-cc`` annotation that is not a list of strings (RabbitMQ: invalid-field)."""

    condition = "amqp:invalid-field"


def _cc(value: Value) -> tuple[str, ...]:
    """The distinct routing keys of ``x-cc``, in order: a key named twice routes once."""
    if not isinstance(value, list) or not all(
        isinstance(key, str) and not isinstance(key, Symbol) for key in value
    ):
        raise InvalidCc(f"bad value for 'x-cc' message-annotation: {value!r}")
    return tuple(dict.fromkeys(str(key) for key in value))


def _string(payload: bytes | memoryview, item: int, end: int) -> str | None:
    code = payload[item]
    if code == 0x40:
        return None
    if code == 0xA1:
        start = item + 2
    elif code == 0xB1:
        start = item + 5
    else:
        raise DecodeError("the properties' to and subject must be strings")
    try:
        return bytes(payload[start:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("invalid UTF-8 in a string") from None


def _properties(
    payload: bytes | memoryview, pos: int, end: int
) -> tuple[str | None, str | None, int | None]:
    """Walk the properties list (from ``pos`` to ``end``) to the fields wanted."""
    code = payload[pos]
    if code == 0x45:
        return None, None, None
    if code == 0xC0:
        count, item = payload[pos + 2], pos + 3
    elif code == 0xD0:
        count, item = int.from_bytes(payload[pos + 5 : pos + 9], "big"), pos + 9
    else:
        raise DecodeError("the properties section is not a list")
    to: str | None = None
    subject: str | None = None
    absolute: int | None = None
    for index in range(min(count, _ABSOLUTE_EXPIRY_TIME + 1)):
        if item >= end:
            raise DecodeError("the properties list has fewer items than its count")
        next_item = _end(payload, item)
        if next_item > end:
            raise DecodeError("a property runs past the properties section")
        if index == _TO:
            to = _string(payload, item, next_item)
        elif index == _SUBJECT:
            subject = _string(payload, item, next_item)
        elif index == _ABSOLUTE_EXPIRY_TIME:
            value, _ = decode(payload, item)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise DecodeError("absolute-expiry-time is not a timestamp")
            absolute = value
        item = next_item
    return to, subject, absolute
