"""A message as a client publishes it, encoded by the server's codec (AMQP 1.0 §3.2).

The Spark sink writes each row as a message straight from Arrow's columns, with no
``proton.Message`` per row; values keep the AMQP types of ``wire/amqp_types.py``.
"""

from __future__ import annotations

from typing import Final

from sluicegate.wire.amqp_types import Symbol, Timestamp
from sluicegate.wire.encoding import encode_compound, encode_value, encode_variable

_DURABLE_HEADER: Final = b"\x00\x53\x70\xc0\x02\x01\x41"
_SECTION: Final = b"\x00\x53"
_NULL: Final = b"\x40"


def encode_message(
    body: bytes,
    *,
    durable: bool,
    message_id: object = None,
    correlation_id: object = None,
    subject: str | None = None,
    content_type: str | None = None,
    creation_time: Timestamp | None = None,
    application_properties: dict[str, object] | None = None,
    message_annotations: dict[Symbol, object] | None = None,
) -> bytes:
    """A message with a data-section body, as a client publishes it."""
    sections = [_DURABLE_HEADER] if durable else []
    if message_annotations:
        sections.append(_SECTION + b"\x72" + encode_value(message_annotations))
    fields = [
        encode_value(message_id),
        _NULL,
        _NULL,
        _NULL if subject is None else encode_value(subject),
        _NULL,
        encode_value(correlation_id),
        _NULL if content_type is None else encode_value(Symbol(content_type)),
        _NULL,
        _NULL,
        _NULL if creation_time is None else encode_value(creation_time),
    ]
    while fields and fields[-1] == _NULL:
        fields.pop()
    if fields:
        properties = encode_compound(b"".join(fields), len(fields), 0xC0, 0xD0)
        sections.append(_SECTION + b"\x73" + properties)
    if application_properties:
        sections.append(_SECTION + b"\x74" + encode_value(application_properties))
    sections.append(_SECTION + b"\x75" + encode_variable(body, 0xA0, 0xB0))
    return b"".join(sections)
