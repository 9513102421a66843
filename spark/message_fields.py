"""Every field a consumer reads of a delivered message, in one pass over its bytes (AMQP 1.0 §3.2).

The server reads only what it acts on (``wire/envelope.py``); a client such as the Spark connector
reads everything: the header's delivery-count, both annotation maps, the properties, the
application properties and the body. proton's ``Message.decode`` does that through a tree of
``pn_data`` nodes and a Python object per node, about 40 µs a message with four application
properties; this reader walks the bytes once with the common encodings inlined (small lists
and maps, strings, symbols, the integer and timestamp widths; ``spark/field_values.py``) and
hands everything else to the codec, several times faster. Values keep their AMQP type
(``spark/field_values.py`` says which); ``spark/message_encoding.py`` writes them back.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final, NamedTuple, TypeAlias

from sluicegate.spark.field_values import (
    I64,
    Field,
    compound_head,
    map_head,
    read_entries,
    read_value,
)
from sluicegate.spark.message_annotations import (
    OFFSET_BYTES,
    STREAM_OFFSET_KEY,
    Known,
    read_annotations,
)
from sluicegate.wire.amqp_types import Symbol, Timestamp
from sluicegate.wire.decoding import decode, skip
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import section_code

# Positions in the header and properties lists (§3.2.1, §3.2.4).
_DELIVERY_COUNT: Final = 4
_MESSAGE_ID: Final = 0
_SUBJECT: Final = 3
_CORRELATION_ID: Final = 5
_CONTENT_TYPE: Final = 6
_CREATION_TIME: Final = 9
_WANTED_PROPERTIES: Final = frozenset(
    {_MESSAGE_ID, _SUBJECT, _CORRELATION_ID, _CONTENT_TYPE, _CREATION_TIME}
)
_new_fields: Final = tuple.__new__
# The properties a reader keeps: message-id, correlation-id, subject, content-type, creation-time.
Properties: TypeAlias = tuple[Field, Field, str | None, str | None, Timestamp | None]
_NO_PROPERTIES: Final[Properties] = (None, None, None, None, None)


class MessageFields(NamedTuple):
    """What a delivered message carries, decoded; absent fields are None (or 0 for a count)."""

    body: bytes | Field
    # How the body was encoded: "data" (bytes), "amqp-value" or "amqp-sequence"; None: no body.
    body_section: str | None
    delivery_count: int
    durable: bool
    message_annotations: dict[Field, Field] | None
    message_id: Field
    correlation_id: Field
    subject: str | None
    content_type: str | None
    creation_time: Timestamp | None
    application_properties: dict[Field, Field] | None
    # What a stream's reader takes apart: x-stream-offset when it is a long (or a uint, ulong),
    # and the annotations but x-stream-offset, read-only (shared by messages that carry the same).
    stream_offset: int | None
    other_annotations: Mapping[Field, Field] | None


class Lead(NamedTuple):
    """The bytes a message starts with, its header (if any) then its message annotations (up
    to a stamped offset's eight bytes), and what they decode to. The next messages of a queue
    or stream mostly start with the same bytes, and skip decoding them."""

    prefix: bytes
    # Where a message that starts with the prefix goes on: past a stamped offset's bytes.
    skipped: int
    durable: bool
    delivery_count: int
    annotations: Known
    stamped: bool


class Keys(NamedTuple):
    """The leading keys of an application-properties map: each as encoded (a str8 or sym8),
    that followed by a str8's constructor (the usual value), its size and what it decodes to;
    and all the map's keys, to tell when they change."""

    encoded: tuple[tuple[bytes, bytes, int, Field], ...]
    names: tuple[Field, ...]


# The keys of the last application-properties map (at most _KEYS_KEPT of them as encoded, so
# one small map's worth): a queue's or stream's next message mostly names the same keys in the
# same order, and they are compared as bytes rather than decoded.
_KEYS_KEPT: Final = 64


class _Reused:
    """What the last message read leaves for the next: its lead and its application
    properties' keys (one of each, the bound of these caches)."""

    __slots__ = ("keys", "lead")

    def __init__(self) -> None:
        self.lead: Lead | None = None
        self.keys = Keys((), ())


REUSED: Final = _Reused()


def read_fields(payload: bytes | bytearray | memoryview) -> MessageFields:
    """Decode every section of an encoded message; ``DecodeError`` if it is malformed.

    The sections a sender writes in the usual way (small lists and maps, described by small
    ulongs) are walked inline, with section codes and constructors as literals (the per-message
    path of a client reading 50,000 messages a second); anything else goes through
    :func:`read_value` and the codec. A stream's message that starts with the same bytes as the
    last one up to its offset (its header and stamped annotations) takes their decoded values.
    """
    buf = payload if type(payload) is bytes else bytes(payload)
    lead = REUSED.lead
    try:
        if lead is not None and buf.startswith(lead.prefix) and lead.skipped <= len(buf):
            annotations = lead.annotations.entries.copy()
            stream_offset = None
            if lead.stamped:
                stream_offset = I64.unpack_from(buf, lead.skipped - OFFSET_BYTES)[0]
                annotations[STREAM_OFFSET_KEY] = stream_offset
            return _sections(
                buf,
                lead.skipped,
                (lead.durable, lead.delivery_count),
                (annotations, lead.annotations.view, stream_offset),
            )
        return _sections(buf, 0, (False, 0), (None, None, None))
    except (IndexError, struct.error):
        raise DecodeError("a value runs past the end of the message") from None
    except UnicodeDecodeError:
        raise DecodeError("invalid UTF-8 in a string") from None


# What message annotations read as: all of them, the others (but x-stream-offset), the offset.
_Annotations = tuple[dict[Field, Field] | None, Mapping[Field, Field] | None, int | None]


def _sections(
    buf: bytes, pos: int, header: tuple[bool, int], annotated: _Annotations
) -> MessageFields:
    """The sections from ``pos`` on, after what a lead gave (``header``, ``annotated``).

    Message annotations right after a header that starts the message (``header_end``), or
    starting it, make the prefix the next message may share.
    """
    size = len(buf)
    durable, delivery_count = header
    annotations, others, stream_offset = annotated
    properties: Properties = _NO_PROPERTIES
    application: dict[Field, Field] | None = None
    body: Field = None
    body_section: str | None = None
    header_end = -1
    while pos < size:
        start = pos
        if buf[pos] != 0x00:
            raise DecodeError("a message section is not a described value")
        if buf[pos + 1] == 0x53:
            code = buf[pos + 2]
            pos += 3
        else:
            descriptor, pos = decode(buf, pos + 1)
            code = section_code(descriptor)
        if code == 0x73:  # properties
            properties, pos = read_properties(buf, pos)
        elif code == 0x74:  # application-properties
            application, pos = read_application_properties(buf, pos)
        elif code == 0x75:  # data
            body, pos = _data(buf, pos, body, body_section)
            body_section = "data"
        elif code == 0x70:  # header
            durable, delivery_count, pos = _header(buf, pos, delivery_count)
            header_end = pos if start == 0 else header_end
        elif code == 0x72:  # message-annotations
            leads = start == 0 or start == header_end
            annotations, others, stream_offset, pos = _annotations(
                buf, pos, (durable, delivery_count) if leads else None
            )
        elif code == 0x77 or code == 0x76:  # amqp-value, amqp-sequence
            body, pos = read_value(buf, pos)
            body_section = "amqp-value" if code == 0x77 else "amqp-sequence"
        elif code == 0x71 or code == 0x78:  # delivery-annotations, footer
            pos = skip(buf, pos)
        else:
            raise DecodeError(f"unknown message section 0x{code:x}")
    if pos > size:
        raise DecodeError("a value runs past the end of the message")
    head = (body, body_section, delivery_count, durable, annotations)
    return _new_fields(MessageFields, (*head, *properties, application, stream_offset, others))


def _annotations(
    buf: bytes, pos: int, header: tuple[bool, int] | None
) -> tuple[dict[Field, Field] | None, Mapping[Field, Field] | None, int | None, int]:
    """Message annotations (see :func:`read_annotations`) and where they end; annotations
    that lead the message (after its ``header``, if not None) and are common ones are the lead
    the next message may share."""
    annotations, others, stream_offset, known, end = read_annotations(buf, pos)
    if known is not None and header is not None:
        stamped = stream_offset is not None
        prefix = buf[: end - OFFSET_BYTES if stamped else end]
        REUSED.lead = Lead(prefix, end, *header, known, stamped)
    return annotations, others, stream_offset, end


def _header(buf: bytes, pos: int, delivery_count: int) -> tuple[bool, int, int]:
    """The header's durable flag and delivery-count (``delivery_count`` if it leaves it out:
    zero, §3.2.1), and where the header ends."""
    if buf[pos] == 0xC0 and buf[pos + 2] <= _DELIVERY_COUNT:
        return buf[pos + 2] > 0 and buf[pos + 3] == 0x41, delivery_count, pos + 2 + buf[pos + 1]
    value, pos = read_value(buf, pos)
    if not isinstance(value, list):
        raise DecodeError("the header section is not a list")
    durable = bool(value[0]) if value else False
    if len(value) > _DELIVERY_COUNT:
        found = value[_DELIVERY_COUNT]
        delivery_count = found if isinstance(found, int) else 0
    return durable, delivery_count, pos


def _data(buf: bytes, pos: int, body: Field, body_section: str | None) -> tuple[Field, int]:
    """The body with the data section at ``pos`` added, and where the section ends: a body of
    several data sections is their concatenation (§3.2.6)."""
    if buf[pos] == 0xA0:
        end = pos + 2 + buf[pos + 1]
        section = buf[pos + 2 : end]
    else:
        value, end = read_value(buf, pos)
        if not isinstance(value, bytes):
            raise DecodeError("a data section does not hold binary")
        section = value
    if body_section is None:
        return section, end
    if body_section == "data":
        return bytes(body) + section, end  # type: ignore[arg-type]
    raise DecodeError(f"a data section after an {body_section} body")


def read_properties(buf: bytes, pos: int) -> tuple[Properties, int]:
    """The properties a reader keeps (message-id, correlation-id, subject, content-type,
    creation-time; a subject or content-type that is not a string and a creation-time that is
    not a timestamp are None) and where the section ends."""
    message_id: Field = None
    correlation_id: Field = None
    subject: Field = None
    content_type: Field = None
    created: Field = None
    constructor = buf[pos]
    if constructor == 0x45 or constructor == 0x40:
        count, item, end = 0, pos + 1, pos + 1
    else:
        head = compound_head(buf, pos, 0xC0)
        if head is None:
            raise DecodeError("the properties section is not a list")
        count, item, end = head
    for index in range(count if count <= _CREATION_TIME else _CREATION_TIME + 1):
        field = buf[item]
        if field == 0x40:
            item += 1
        elif field == 0xA1 and index == _MESSAGE_ID:
            next_item = item + 2 + buf[item + 1]
            message_id = buf[item + 2 : next_item].decode()
            item = next_item
        elif index in _WANTED_PROPERTIES:
            value, item = read_value(buf, item)
            if index == _MESSAGE_ID:
                message_id = value
            elif index == _SUBJECT:
                subject = value
            elif index == _CORRELATION_ID:
                correlation_id = value
            elif index == _CONTENT_TYPE:
                content_type = value
            else:
                created = value
        else:
            item = skip(buf, item)
    if item > end or end > len(buf):
        raise DecodeError("the properties run past their section")
    return (
        message_id,
        correlation_id,
        subject if isinstance(subject, str) else None,
        content_type if isinstance(content_type, str) else None,
        created if isinstance(created, Timestamp) else None,
    ), end


def read_application_properties(buf: bytes, pos: int) -> tuple[dict[Field, Field] | None, int]:
    """Application properties: a map as :func:`_map` reads it, the keys the last message's map
    named in the same order matched by their bytes (with a string value's constructor: one
    comparison for the key and the kind of value)."""
    if buf[pos] == 0xC1:
        count, item, end = buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
        if count % 2:
            raise DecodeError("a map has an odd number of items")
        if end > len(buf):
            raise DecodeError("the application-properties run past the end of the message")
        entries = count >> 1
    else:
        head = map_head(buf, pos, "application-properties")
        if head is None:
            return None, pos + 1
        entries, item, end = head
    result: dict[Field, Field] = {}
    for text_entry, encoded, size, key in REUSED.keys.encoded[:entries]:
        if buf.startswith(text_entry, item):
            item += size + 1
            value_end = item + 1 + buf[item]
            result[key] = buf[item + 1 : value_end].decode()
            item = value_end
        elif buf.startswith(encoded, item):
            result[key], item = read_value(buf, item + size)
        else:
            break
    if len(result) < entries:
        item = read_entries(buf, item, entries - len(result), result)
        names = tuple(result)
        if names != REUSED.keys.names:
            REUSED.keys = Keys(_encoded_keys(names), names)
    if item > end:
        raise DecodeError("the application-properties run past their section")
    return result, end


def known_values(buf: bytes, pos: int, layout: Keys) -> tuple[list[Field], int] | None:
    """The values of application properties that name all the keys of the last message's map
    in the same order (a map8, the keys matched as :func:`_application_properties` does), and
    where they end; None if they do not."""
    encoded = layout.encoded
    count = len(encoded)
    end = pos + 2 + buf[pos + 1]
    if buf[pos] != 0xC1 or buf[pos + 2] != 2 * count or len(layout.names) != count:
        return None
    item = pos + 3
    values: list[Field] = []
    for text_entry, key, size, _ in encoded:
        if buf.startswith(text_entry, item):
            item += size + 1
            value_end = item + 1 + buf[item]
            values.append(buf[item + 1 : value_end].decode())
            item = value_end
        elif buf.startswith(key, item):
            value, item = read_value(buf, item + size)
            values.append(value)
        else:
            return None
    return (values, end) if item <= end <= len(buf) else None


def _encoded_keys(names: tuple[Field, ...]) -> tuple[tuple[bytes, bytes, int, Field], ...]:
    """The leading string and symbol keys of ``names`` as a str8 or sym8 encodes them."""
    encoded = []
    for name in names[:_KEYS_KEPT]:
        if not isinstance(name, str):
            break
        raw = name.encode()
        if len(raw) > 0xFF:
            break
        key = bytes((0xA3 if type(name) is Symbol else 0xA1, len(raw))) + raw
        encoded.append((key + b"\xa1", key, len(key), name))
    return tuple(encoded)
