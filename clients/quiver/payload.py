"""The one message every sender sends, encoded once, and where its send-time stamp sits.

The body's first 8 bytes carry the send time (big-endian int64 nanoseconds of ``time.time_ns``,
so two hosts with synchronised clocks can be measured too). The sender patches those bytes in a
pre-encoded copy per message; the receiver reads them from the raw transfer without decoding.
A body is the last section of a message (no footer is sent), so the receiver finds the stamp
``body_size`` bytes before the *end*: headers or annotations a broker adds do not move it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from proton import Message

__all__ = ["PayloadError", "Template", "body_headers", "check_stamped", "encode_template"]

SECTION_DESCRIPTOR: Final[bytes] = b"\x00\x53"  # described type, smallulong descriptor code
BODY_SECTION_CODES: Final[frozenset[int]] = frozenset({0x75, 0x77})  # data, amqp-value
VBIN8: Final[int] = 0xA0  # binary with a one-byte length
MAX_VBIN8: Final[int] = 255  # the largest length one byte holds
VBIN32: Final[int] = 0xB0  # binary, four-byte length


class PayloadError(ValueError):
    """A received message is not one the quiver sent: it has no binary body of the agreed size."""


@dataclass(frozen=True, slots=True)
class Template:
    """The encoded message and the offset of the stamp in it."""

    encoded: bytes
    stamp_offset: int


def encode_template(body_size: int, durable: bool) -> Template:
    """Encode a message with a zeroed ``body_size``-byte data section, once per sender."""
    message = Message(body=bytes(body_size), durable=durable)
    message.inferred = True  # bytes as a data section, not an amqp-value
    encoded = message.encode()
    return Template(encoded=encoded, stamp_offset=len(encoded) - body_size)


def body_headers(body_size: int) -> frozenset[bytes]:
    """Every section header that may open a binary body of ``body_size`` bytes."""
    headers = {
        SECTION_DESCRIPTOR + bytes((code, VBIN32)) + body_size.to_bytes(4, "big")
        for code in BODY_SECTION_CODES
    }
    if body_size <= MAX_VBIN8:
        headers |= {
            SECTION_DESCRIPTOR + bytes((code, VBIN8, body_size)) for code in BODY_SECTION_CODES
        }
    return frozenset(headers)


def check_stamped(raw: bytes, headers: frozenset[bytes], body_size: int) -> None:
    """Raise ``PayloadError`` unless ``raw`` ends with a binary body of ``body_size`` bytes.

    A receiver checks its first message only: anything else on the address means other
    traffic, and reading stamps from it would report nonsense latencies.
    """
    body_start = len(raw) - body_size
    if not any(raw[body_start - len(h) : body_start] == h for h in headers if len(h) <= body_start):
        raise PayloadError(
            f"a {len(raw)}-byte message without a {body_size}-byte binary body at its end"
        )
