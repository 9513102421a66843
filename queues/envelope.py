"""What the server reads of a message when it is published: the envelope, never the body.

One pass over the leading sections at publish time validates the header (so that every stored
message has one that can be re-encoded when its delivery-count goes up) and picks out the few
fields routing and expiry need. Annotation sections are skipped by width, the properties list is
walked item by item only as far as ``absolute-expiry-time``, and reading stops at
application-properties: the body is never reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from queues.codec import decode, skip
from queues.errors import DecodeError
from queues.sections import (
    APPLICATION_PROPERTIES,
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    Header,
    header_from,
    section_code,
)

# Positions in the properties list (AMQP 1.0 §3.2.4).
_TO: Final = 2
_SUBJECT: Final = 3
_ABSOLUTE_EXPIRY_TIME: Final = 8
_NO_HEADER: Final = Header()


@dataclass(frozen=True, slots=True)
class Envelope:
    """The fields of a published message the server acts on."""

    header: Header
    to: str | None = None
    subject: str | None = None
    # Milliseconds since the epoch, as AMQP timestamps are.
    absolute_expiry_time: int | None = None

    def expires(self, now: int) -> int | None:
        """When the message expires by its own ttl or absolute-expiry-time, if ever."""
        ttl = self.header.ttl
        deadline = None if ttl is None else now + ttl
        absolute = self.absolute_expiry_time
        if absolute is not None and absolute > 0 and (deadline is None or absolute < deadline):
            return absolute
        return deadline


def read_envelope(payload: bytes | memoryview) -> Envelope:
    """Read the header and the routing/expiry properties; raise DecodeError if malformed."""
    header = _NO_HEADER
    to: str | None = None
    subject: str | None = None
    absolute: int | None = None
    pos = 0
    size = len(payload)
    while pos < size:
        if payload[pos] != 0x00:
            raise DecodeError("a message section is not a described value")
        descriptor, value_pos = decode(payload, pos + 1)
        code = section_code(descriptor)
        if code == HEADER:
            value, pos = decode(payload, value_pos)
            header = header_from(value)
        elif code in (DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS):
            pos = skip(payload, value_pos)
        elif code == PROPERTIES:
            to, subject, absolute, pos = _properties(payload, value_pos)
        elif code >= APPLICATION_PROPERTIES:
            break
        else:
            raise DecodeError(f"unknown message section 0x{code:x}")
    return Envelope(header, to, subject, absolute)


def _properties(
    payload: bytes | memoryview, pos: int
) -> tuple[str | None, str | None, int | None, int]:
    """Walk the properties list to the fields wanted; return them and the section's end."""
    end = skip(payload, pos)
    code = payload[pos]
    if code == 0x45:
        return None, None, None, end
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
        if index in (_TO, _SUBJECT, _ABSOLUTE_EXPIRY_TIME):
            value, next_item = decode(payload, item)
            if index == _ABSOLUTE_EXPIRY_TIME:
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise DecodeError("absolute-expiry-time is not a timestamp")
                absolute = value
            elif value is not None:
                if not isinstance(value, str):
                    raise DecodeError("the properties' to and subject must be strings")
                if index == _TO:
                    to = value
                else:
                    subject = value
            item = next_item
        else:
            item = skip(payload, item)
    return to, subject, absolute, end
