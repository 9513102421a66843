"""Every field a consumer reads of a delivered message, in one pass over its bytes (AMQP 1.0 §3.2).

The server reads only what it acts on (``wire/envelope.py``); a client such as the Spark connector
reads everything: the header's delivery-count, both annotation maps, the properties, the
application properties and the body. proton's ``Message.decode`` does that through a tree of
``pn_data`` nodes and a Python object per node, about 40 µs a message with four application
properties; this reader walks the bytes once with the common encodings inlined (small lists
and maps, strings, symbols, the integer and timestamp widths) and hands everything else to the
codec, several times faster.

Values keep their AMQP type where Python would lose it: a uuid is a :class:`uuid.UUID`, a char
a one-character ``str``, a timestamp a :class:`~sluicegate.wire.codec.Timestamp`, a symbol a
:class:`~sluicegate.wire.codec.Symbol`, a decimal a :class:`decimal.Decimal`, an AMQP float
(32 bits) a :class:`Float32`, a byte, short or int a :class:`Byte`, :class:`Short` or
:class:`Int` (an unsigned ubyte or ushort the next wider signed type); a long, uint and ulong are
plain ``int``. :func:`encode_message` writes them back with the same types.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Collection, Iterable, Mapping
from decimal import Context, Decimal
from types import MappingProxyType
from typing import Final, NamedTuple, TypeAlias, cast

from sluicegate.wire.annotations import X_STREAM_OFFSET
from sluicegate.wire.codec import Described, Symbol, Timestamp, Value, decode, skip
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import section_code

__all__ = [
    "COLUMN_FIELDS",
    "Byte",
    "EncodeError",
    "FieldColumns",
    "Float32",
    "Int",
    "MessageFields",
    "Short",
    "encode_message",
    "encode_value",
    "read_fields",
]

_HEADER: Final = 0x70
_DELIVERY_ANNOTATIONS: Final = 0x71
_MESSAGE_ANNOTATIONS: Final = 0x72
_PROPERTIES: Final = 0x73
_APPLICATION_PROPERTIES: Final = 0x74
_DATA: Final = 0x75
_AMQP_SEQUENCE: Final = 0x76
_AMQP_VALUE: Final = 0x77
_FOOTER: Final = 0x78
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

_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_I8 = struct.Struct(">b")


# What a field decodes to: the codec's values, and the types only a client reads.
Field: TypeAlias = (
    "bool | int | float | str | bytes | list[Field] | dict[Field, Field] | Described"
    " | uuid.UUID | Decimal | None"
)


class Float32(float):
    """An AMQP float (32 bits): kept apart from a double so that it is encoded back as one."""

    __slots__ = ()


class Byte(int):
    """An AMQP byte (8-bit signed): a Python ``int`` is sent as a long."""

    __slots__ = ()


class Short(int):
    """An AMQP short (16-bit signed)."""

    __slots__ = ()


class Int(int):
    """An AMQP int (32-bit signed)."""

    __slots__ = ()


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


# x-stream-offset as the only message annotation, as a stream stamps a message without others:
# a map8 of one entry, the symbol key and a long (its eight bytes follow).
_STREAM_OFFSET_ONLY: Final = b"\xc1\x1b\x02\xa3\x0fx-stream-offset\x81"
_STREAM_OFFSET_KEY: Final = X_STREAM_OFFSET
# x-stream-offset as the last entry of a larger map, as a stream stamps it after x-exchange and
# x-routing-key: the symbol key and a long, whose eight bytes end the map.
_STREAM_OFFSET_ENTRY: Final = b"\xa3\x0fx-stream-offset\x81"
_STREAM_OFFSET_ENTRY_BYTES: Final = len(_STREAM_OFFSET_ENTRY) + 8
_OFFSET_BYTES: Final = 8


class _Known(NamedTuple):
    """Message annotations decoded once for every message that carries the same bytes: the
    entries to copy into each message's dict (all but a stamped x-stream-offset), and the
    read-only view those messages share as their ``other_annotations``."""

    entries: dict[Field, Field]
    view: Mapping[Field, Field] | None


# Small annotation maps by their encoded bytes, up to a stamped x-stream-offset: a stream's or
# a queue's messages mostly carry the same ones (the exchange and routing key they came by,
# spliced in by the gateway), so each is decoded once. A handful per queue; bounded all the
# same (emptied when full), and only maps of immutable values are kept.
_ANNOTATION_CACHE_SIZE: Final = 256
_annotation_cache: dict[bytes, _Known] = {}
_IMMUTABLE: Final = (str, int, float, bool, bytes, type(None))
_new_fields: Final = tuple.__new__


class _Lead(NamedTuple):
    """The bytes a message starts with, its header (if any) then its message annotations (up
    to a stamped offset's eight bytes), and what they decode to. The next messages of a queue
    or stream mostly start with the same bytes, and skip decoding them."""

    prefix: bytes
    # Where a message that starts with the prefix goes on: past a stamped offset's bytes.
    skipped: int
    durable: bool
    delivery_count: int
    annotations: _Known
    stamped: bool


# The last message's lead: a single entry, the bound of this cache.
_last_lead: _Lead | None = None


def read_fields(payload: bytes | bytearray | memoryview) -> MessageFields:
    """Decode every section of an encoded message; ``DecodeError`` if it is malformed.

    The sections a sender writes in the usual way (small lists and maps, described by small
    ulongs) are walked inline, with section codes and constructors as literals (the per-message
    path of a client reading 50,000 messages a second); anything else goes through
    :func:`_value` and the codec. A stream's message that starts with the same bytes as the
    last one up to its offset (its header and stamped annotations) takes their decoded values.
    """
    global _last_lead
    buf = payload if type(payload) is bytes else bytes(payload)
    size = len(buf)
    pos = 0
    delivery_count = 0
    durable = False
    annotations: dict[Field, Field] | None = None
    others: Mapping[Field, Field] | None = None
    stream_offset: int | None = None
    message_id: Field = None
    correlation_id: Field = None
    subject: str | None = None
    content_type: str | None = None
    created: Timestamp | None = None
    application: dict[Field, Field] | None = None
    body: Field = None
    body_section: str | None = None
    # Where a header that starts the message ends: stamped annotations right after it (or
    # starting the message) make the prefix the next message may share.
    header_end = -1
    lead = _last_lead
    if lead is not None and buf.startswith(lead.prefix):
        _, skipped, lead_durable, lead_count, lead_annotations, lead_stamped = lead
        if skipped <= size:
            pos = skipped
            annotations = lead_annotations.entries.copy()
            others = lead_annotations.view
            if lead_stamped:
                stream_offset = _I64.unpack_from(buf, pos - _OFFSET_BYTES)[0]
                annotations[_STREAM_OFFSET_KEY] = stream_offset
            durable, delivery_count = lead_durable, lead_count
    try:
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
            constructor = buf[pos]
            if code == 0x73:  # properties
                message_id, correlation_id, subject, content_type, created, pos = _properties(
                    buf, pos
                )
            elif code == 0x74:  # application-properties
                application, pos = _application_properties(buf, pos)
            elif code == 0x75:  # data
                if constructor == 0xA0:
                    end = pos + 2 + buf[pos + 1]
                    section = buf[pos + 2 : end]
                    pos = end
                else:
                    value, pos = _value(buf, pos)
                    if not isinstance(value, bytes):
                        raise DecodeError("a data section does not hold binary")
                    section = value
                # A body of several data sections is their concatenation (§3.2.6).
                if body_section is None:
                    body = section
                elif body_section == "data":
                    body = bytes(body) + section  # type: ignore[arg-type]
                else:
                    raise DecodeError(f"a data section after an {body_section} body")
                body_section = "data"
            elif code == 0x70:  # header
                if constructor == 0xC0 and buf[pos + 2] <= _DELIVERY_COUNT:
                    # delivery-count left out: zero (§3.2.1).
                    durable = buf[pos + 2] > 0 and buf[pos + 3] == 0x41
                    pos += 2 + buf[pos + 1]
                else:
                    value, pos = _value(buf, pos)
                    if not isinstance(value, list):
                        raise DecodeError("the header section is not a list")
                    durable = bool(value[0]) if value else False
                    if len(value) > _DELIVERY_COUNT:
                        found = value[_DELIVERY_COUNT]
                        delivery_count = found if isinstance(found, int) else 0
                if start == 0:
                    header_end = pos
            elif code == 0x72:  # message-annotations
                annotations, others, stream_offset, known, pos = _annotations(buf, pos)
                if known is not None and (start == 0 or start == header_end):
                    stamped = stream_offset is not None
                    _last_lead = _Lead(
                        buf[: pos - _OFFSET_BYTES if stamped else pos],
                        pos,
                        durable,
                        delivery_count,
                        known,
                        stamped,
                    )
            elif code == 0x77 or code == 0x76:  # amqp-value, amqp-sequence
                body, pos = _value(buf, pos)
                body_section = "amqp-value" if code == 0x77 else "amqp-sequence"
            elif code == 0x71 or code == 0x78:  # delivery-annotations, footer
                pos = skip(buf, pos)
            else:
                raise DecodeError(f"unknown message section 0x{code:x}")
    except (IndexError, struct.error):
        raise DecodeError("a value runs past the end of the message") from None
    except UnicodeDecodeError:
        raise DecodeError("invalid UTF-8 in a string") from None
    if pos > size:
        raise DecodeError("a value runs past the end of the message")
    return _new_fields(
        MessageFields,
        (
            body,
            body_section,
            delivery_count,
            durable,
            annotations,
            message_id,
            correlation_id,
            subject,
            content_type,
            created,
            application,
            stream_offset,
            others,
        ),
    )


def _properties(
    buf: bytes, pos: int
) -> tuple[Field, Field, str | None, str | None, Timestamp | None, int]:
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
        head = _compound_head(buf, pos, 0xC0)
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
            value, item = _value(buf, item)
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
        end,
    )


# The fields a reader of columns may leave out (each is skipped unread when it does): the rest,
# the offset, delivery-count and the annotations but x-stream-offset, come with the lead.
_PROPERTY_FIELDS: Final = (
    "message_id",
    "correlation_id",
    "subject",
    "content_type",
    "creation_time",
)
COLUMN_FIELDS: Final = frozenset({"body", "application_properties", *_PROPERTY_FIELDS})
# The sections after a lead as a sender usually writes them, by their small-ulong descriptors.
_PROPERTIES_SECTION: Final = b"\x00\x53\x73"
_APPLICATION_SECTION: Final = b"\x00\x53\x74"
_DATA8_SECTION: Final = b"\x00\x53\x75\xa0"
_DATA32_SECTION: Final = b"\x00\x53\x75\xb0"


class FieldColumns:
    """Many messages' fields decoded straight into one list per field (a column), for a reader
    that builds columnar batches: no object per message, and only the fields asked for.

    A message laid out as a stream's or a queue's usually are, the lead the last message
    started with (see :class:`_Lead`) then any of properties, application properties and one
    data section in that order, is read inline, the sections whose fields are not asked for
    skipped by their size, unchecked (where :func:`read_fields` checks every value); any
    other message goes through :func:`read_fields`. Either way a column holds what
    :func:`read_fields` gives for that field.

    ``offset`` holds each row's stream offset (or its number, see :meth:`add_numbered`),
    ``delivery_count`` and ``other_annotations`` are always filled. Application properties are
    laid end to end: ``property_keys`` and ``property_values`` hold every row's entries in
    order, and ``property_ends`` where each row's end (after a leading 0); a row without
    entries (no map, or an empty one) ends where it starts.
    """

    def __init__(self, fields: Collection[str]) -> None:
        unknown = set(fields) - COLUMN_FIELDS
        if unknown:
            raise ValueError(f"no column fields {sorted(unknown)}")
        self.fields = frozenset(fields)
        self.offset: list[int] = []
        self.delivery_count: list[int] = []
        self.other_annotations: list[Mapping[Field, Field] | None] = []
        self.body: list[Field] = []
        self.message_id: list[Field] = []
        self.correlation_id: list[Field] = []
        self.subject: list[str | None] = []
        self.content_type: list[str | None] = []
        self.creation_time: list[Timestamp | None] = []
        self.property_ends: list[int] = [0]
        self.property_keys: list[Field] = []
        self.property_values: list[Field] = []

    def __len__(self) -> int:
        return len(self.offset)

    def add_stream(
        self, payloads: Iterable[bytes | bytearray | memoryview], below: int | None
    ) -> list[int | None]:
        """Add the messages of a stream whose ``x-stream-offset`` is below ``below`` (None: all)
        as rows with that offset; return each message's offset (None: it has none, no row).
        """
        return self._add(payloads, None, below)

    def add_numbered(self, payloads: Iterable[bytes | bytearray | memoryview], first: int) -> None:
        """Add every message as a row, numbered from ``first`` in the offset column."""
        self._add(payloads, first, None)

    def split(self, rows: int) -> FieldColumns:
        """The first ``rows`` rows, taken out: these columns keep the rest."""
        head = FieldColumns(self.fields)
        for name in _ROW_COLUMNS:
            column = getattr(self, name)
            setattr(head, name, column[:rows])
            del column[:rows]
        ends = self.property_ends
        cut = ends[min(rows, len(ends) - 1)]
        head.property_ends = ends[: rows + 1]
        head.property_keys = self.property_keys[:cut]
        head.property_values = self.property_values[:cut]
        del self.property_keys[:cut], self.property_values[:cut]
        self.property_ends = [end - cut for end in ends[rows:]] or [0]
        return head

    def _add(
        self,
        payloads: Iterable[bytes | bytearray | memoryview],
        first: int | None,
        below: int | None,
    ) -> list[int | None]:
        fields = self.fields
        want_body = "body" in fields
        want_properties = not fields.isdisjoint(_PROPERTY_FIELDS)
        want_application = "application_properties" in fields
        found: list[int | None] = []
        note = found.append
        add_offset = self.offset.append
        add_count = self.delivery_count.append
        add_annotations = self.other_annotations.append
        add_body = self.body.append
        add_id, add_correlation = self.message_id.append, self.correlation_id.append
        add_subject, add_type = self.subject.append, self.content_type.append
        add_created = self.creation_time.append
        keys, values = self.property_keys, self.property_values
        add_end = self.property_ends.append
        stream = first is None
        number = 0 if first is None else first - 1
        body: Field
        message_id: Field
        correlation_id: Field
        subject: str | None
        content_type: str | None
        created: Timestamp | None
        application: dict[Field, Field] | None
        others: Mapping[Field, Field] | None
        # A row's application properties in the last message's layout: its keys and values.
        property_keys: tuple[Field, ...]
        property_values: list[Field] | tuple[()]
        for payload in payloads:
            number += 1
            buf = payload if type(payload) is bytes else bytes(payload)
            size = len(buf)
            lead = _last_lead
            row: MessageFields | None = None
            if lead is not None and buf.startswith(lead.prefix) and lead.skipped <= size:
                _, pos, _, delivery_count, known, stamped = lead
                others = known.view
                stream_offset = _I64.unpack_from(buf, pos - _OFFSET_BYTES)[0] if stamped else None
            else:
                row = read_fields(buf)
                stream_offset = row.stream_offset
            if stream:
                note(stream_offset)
                if stream_offset is None or (below is not None and stream_offset >= below):
                    continue
            if row is None:
                message_id = correlation_id = subject = content_type = created = None
                application = body = None
                property_keys = property_values = ()
                try:
                    if buf.startswith(_PROPERTIES_SECTION, pos):
                        if not want_properties:
                            # Skipped by its size: a list8's in its second byte.
                            pos = (
                                pos + 5 + buf[pos + 4]
                                if buf[pos + 3] == 0xC0
                                else skip(buf, pos + 3)
                            )
                        elif buf[pos + 3] == 0xC0 and buf[pos + 5] == 1 and buf[pos + 6] == 0xA1:
                            # A list of one item, a string message-id: the usual properties.
                            end = pos + 5 + buf[pos + 4]
                            item = pos + 8 + buf[pos + 7]
                            message_id = buf[pos + 8 : item].decode()
                            pos = end if item <= end else -1
                        else:
                            message_id, correlation_id, subject, content_type, created, pos = (
                                _properties(buf, pos + 3)
                            )
                    if buf.startswith(_APPLICATION_SECTION, pos):
                        if not want_application:
                            pos = (
                                pos + 5 + buf[pos + 4]
                                if buf[pos + 3] == 0xC1
                                else skip(buf, pos + 3)
                            )
                        elif (known_values := _known_values(buf, pos + 3, _last_keys)) is None:
                            application, pos = _application_properties(buf, pos + 3)
                        else:
                            property_keys, (property_values, pos) = _last_keys.names, known_values
                    if buf.startswith(_DATA8_SECTION, pos):
                        end = pos + 5 + buf[pos + 4]
                        if want_body:
                            body = buf[pos + 5 : end]
                        pos = end
                    elif buf.startswith(_DATA32_SECTION, pos):
                        end = pos + 8 + _U32.unpack_from(buf, pos + 4)[0]
                        if want_body:
                            body = buf[pos + 8 : end]
                        pos = end
                    else:
                        pos = -1
                except (DecodeError, IndexError, struct.error, UnicodeDecodeError):
                    pos = -1
                if pos != size:
                    # Another layout, or a malformed message: read_fields says which.
                    row = read_fields(buf)
            if row is not None:
                body, delivery_count, others = row.body, row.delivery_count, row.other_annotations
                message_id, correlation_id, subject, content_type, created = row[5:10]
                application = row.application_properties
                property_keys = ()
            add_offset(number if first is not None else stream_offset)  # type: ignore[arg-type]
            add_count(delivery_count)
            add_annotations(others)
            if want_body:
                add_body(body)
            if want_properties:
                add_id(message_id)
                add_correlation(correlation_id)
                add_subject(subject)
                add_type(content_type)
                add_created(created)
            if want_application:
                if application:
                    keys.extend(application)
                    values.extend(application.values())
                elif property_keys:
                    keys.extend(property_keys)
                    values.extend(property_values)
                add_end(len(keys))
        return found


# The columns of one item per row (the application properties are laid out otherwise).
_ROW_COLUMNS: Final = ("offset", "delivery_count", "other_annotations", "body", *_PROPERTY_FIELDS)


# Annotations that are a stamped x-stream-offset alone.
_OFFSET_ALONE: Final = _Known({}, None)


def _annotations(
    buf: bytes, pos: int
) -> tuple[dict[Field, Field] | None, Mapping[Field, Field] | None, int | None, _Known | None, int]:
    """Message annotations, the others and the stream offset (see :class:`MessageFields`),
    what they share with other messages' if they are common ones, and where they end.

    A map8 whose bytes were seen before (up to a stamped offset: x-stream-offset, a long, as
    its last entry) comes from the cache.
    """
    offset: int | None
    if buf.startswith(_STREAM_OFFSET_ONLY, pos):
        offset = _I64.unpack_from(buf, pos + 21)[0]
        return {_STREAM_OFFSET_KEY: offset}, None, offset, _OFFSET_ALONE, pos + 29
    if buf[pos] == 0xC1:
        end = pos + 2 + buf[pos + 1]
        if end <= len(buf):
            tail = end - _STREAM_OFFSET_ENTRY_BYTES
            offset = None
            if tail > pos + 3 and buf.startswith(_STREAM_OFFSET_ENTRY, tail):
                offset = _I64.unpack_from(buf, end - _OFFSET_BYTES)[0]
                encoded = buf[pos:tail]
            else:
                encoded = buf[pos:end]
            known = _annotation_cache.get(encoded)
            if known is None:
                decoded, end = _map(buf, pos, "message-annotations")
                assert decoded is not None
                shared = (
                    _unstamped(decoded) if offset is None else _stamped(buf, pos, tail, decoded)
                )
                if shared is None:
                    others, found = _split(decoded)
                    return decoded, others, found, None, end
                if len(_annotation_cache) >= _ANNOTATION_CACHE_SIZE:
                    _annotation_cache.clear()
                known = _annotation_cache[encoded] = shared
            annotations = known.entries.copy()
            if offset is not None:
                annotations[_STREAM_OFFSET_KEY] = offset
            return annotations, known.view, offset, known, end
    general, end = _map(buf, pos, "message-annotations")
    others, found = _split(general)
    return general, others, found, None, end


def _unstamped(decoded: dict[Field, Field]) -> _Known | None:
    """Annotations without x-stream-offset, to share, if they are immutable."""
    if _STREAM_OFFSET_KEY in decoded or not all(
        isinstance(value, _IMMUTABLE) for value in decoded.values()
    ):
        return None
    entries = dict(decoded)
    return _Known(entries, MappingProxyType(entries))


def _stamped(buf: bytes, pos: int, tail: int, decoded: dict[Field, Field]) -> _Known | None:
    """The entries of a small annotations map before its x-stream-offset, to share, if the
    offset is its last entry (starting at ``tail``, named nowhere before) and they are immutable.
    """
    if not decoded or next(reversed(decoded)) != _STREAM_OFFSET_KEY:
        return None  # not named, or named twice (the first place is kept)
    item = pos + 3
    try:
        for _ in range(buf[pos + 2] - 2):
            item = skip(buf, item)
    except (DecodeError, IndexError):
        return None
    if item != tail:
        return None  # the bytes that look like the offset's entry belong to another value
    entries = dict(decoded)
    del entries[_STREAM_OFFSET_KEY]
    if not all(isinstance(value, _IMMUTABLE) for value in entries.values()):
        return None
    return _Known(entries, MappingProxyType(entries) if entries else None)


def _split(
    annotations: dict[Field, Field] | None,
) -> tuple[Mapping[Field, Field] | None, int | None]:
    """The annotations but x-stream-offset, and the offset if it is a long, uint or ulong."""
    if not annotations or _STREAM_OFFSET_KEY not in annotations:
        return annotations, None
    found = annotations[_STREAM_OFFSET_KEY]
    offset = found if type(found) is int else None
    if len(annotations) == 1:
        return None, offset
    return {k: v for k, v in annotations.items() if k != _STREAM_OFFSET_KEY}, offset


def _compound_head(buf: bytes, pos: int, small: int) -> tuple[int, int, int] | None:
    """A list's or map's count of items, where its first starts and where it ends, if it has
    the constructor ``small`` (list8, map8) or its 32-bit form; None if it has another."""
    constructor = buf[pos]
    if constructor == small:
        return buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    if constructor == small + 0x10:
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        return _U32.unpack_from(buf, pos + 5)[0], pos + 9, end
    return None


def _map_head(buf: bytes, pos: int, section: str) -> tuple[int, int, int] | None:
    """A map's number of entries, where its first starts and where it ends; None if null."""
    if buf[pos] == 0x40:
        return None
    head = _compound_head(buf, pos, 0xC1)
    if head is None:
        raise DecodeError(f"the {section} section is not a map")
    count, item, end = head
    if count % 2:
        raise DecodeError("a map has an odd number of items")
    if end > len(buf):
        raise DecodeError(f"the {section} run past the end of the message")
    return count // 2, item, end


def _map(buf: bytes, pos: int, section: str) -> tuple[dict[Field, Field] | None, int]:
    """An annotations map, or application properties without their known keys."""
    head = _map_head(buf, pos, section)
    if head is None:
        return None, pos + 1
    entries, item, end = head
    result: dict[Field, Field] = {}
    item = _entries(buf, item, entries, result)
    if item > end:
        raise DecodeError(f"the {section} run past their section")
    return result, end


def _entries(buf: bytes, item: int, entries: int, result: dict[Field, Field]) -> int:
    """Add a map's next ``entries`` to ``result``, string and symbol keys inline; where they end."""
    key: Field
    value: Field
    for _ in range(entries):
        code = buf[item]
        if code == 0xA1 or code == 0xA3:
            key_end = item + 2 + buf[item + 1]
            key = buf[item + 2 : key_end].decode()
            if code == 0xA3:
                key = Symbol(key)
            item = key_end
        else:
            key, item = _value(buf, item)
            if isinstance(key, list | dict):
                raise DecodeError("a map key is a compound value")
        # The values application properties mostly hold, inline; the rest by _value.
        code = buf[item]
        if code == 0xA1:
            value_end = item + 2 + buf[item + 1]
            value = buf[item + 2 : value_end].decode()
            item = value_end
        elif code == 0x81:
            value = _I64.unpack_from(buf, item + 1)[0]
            item += 9
        elif code == 0x55:
            value = _I8.unpack_from(buf, item + 1)[0]
            item += 2
        elif code == 0x41 or code == 0x42:
            value = code == 0x41
            item += 1
        elif code == 0x82:
            value = _F64.unpack_from(buf, item + 1)[0]
            item += 9
        else:
            value, item = _value(buf, item)
        result[key] = value
    return item


class _Keys(NamedTuple):
    """The leading keys of an application-properties map: each as encoded (a str8 or sym8),
    that followed by a str8's constructor (the usual value), its size and what it decodes to;
    and all the map's keys, to tell when they change."""

    encoded: tuple[tuple[bytes, bytes, int, Field], ...]
    names: tuple[Field, ...]


# The keys of the last application-properties map (at most _KEYS_KEPT of them as encoded, so
# one small map's worth): a queue's or stream's next message mostly names the same keys in the
# same order, and they are compared as bytes rather than decoded.
_KEYS_KEPT: Final = 64
_last_keys = _Keys((), ())


def _application_properties(buf: bytes, pos: int) -> tuple[dict[Field, Field] | None, int]:
    """Application properties: a map as :func:`_map` reads it, the keys the last message's map
    named in the same order matched by their bytes (with a string value's constructor: one
    comparison for the key and the kind of value)."""
    global _last_keys
    if buf[pos] == 0xC1:
        count, item, end = buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
        if count % 2:
            raise DecodeError("a map has an odd number of items")
        if end > len(buf):
            raise DecodeError("the application-properties run past the end of the message")
        entries = count >> 1
    else:
        head = _map_head(buf, pos, "application-properties")
        if head is None:
            return None, pos + 1
        entries, item, end = head
    result: dict[Field, Field] = {}
    for text_entry, encoded, size, key in _last_keys.encoded[:entries]:
        if buf.startswith(text_entry, item):
            item += size + 1
            value_end = item + 1 + buf[item]
            result[key] = buf[item + 1 : value_end].decode()
            item = value_end
        elif buf.startswith(encoded, item):
            result[key], item = _value(buf, item + size)
        else:
            break
    if len(result) < entries:
        item = _entries(buf, item, entries - len(result), result)
        names = tuple(result)
        if names != _last_keys.names:
            _last_keys = _Keys(_encoded_keys(names), names)
    if item > end:
        raise DecodeError("the application-properties run past their section")
    return result, end


def _known_values(buf: bytes, pos: int, layout: _Keys) -> tuple[list[Field], int] | None:
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
            value, item = _value(buf, item + size)
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


def _value(buf: bytes, pos: int) -> tuple[Field, int]:
    """The value at ``pos`` and where it ends: common encodings inline, the rest by the codec."""
    code = buf[pos]
    if code == 0xA1:
        end = pos + 2 + buf[pos + 1]
        return buf[pos + 2 : end].decode(), end
    if code == 0xA3:
        end = pos + 2 + buf[pos + 1]
        return Symbol(buf[pos + 2 : end].decode()), end
    if code == 0x40:
        return None, pos + 1
    if code == 0xA0:
        end = pos + 2 + buf[pos + 1]
        return buf[pos + 2 : end], end
    if code == 0xC0 or code == 0xC1:
        end = pos + 2 + buf[pos + 1]
        items = _items(buf, pos + 3, end, buf[pos + 2])
        return (items if code == 0xC0 else _pairs(items)), end
    if code == 0x81:
        return _I64.unpack_from(buf, pos + 1)[0], pos + 9
    if code == 0x83:
        return Timestamp(_I64.unpack_from(buf, pos + 1)[0]), pos + 9
    if code == 0x41:
        return True, pos + 1
    if code == 0x42:
        return False, pos + 1
    if code == 0x45:
        return [], pos + 1
    if code in (0x43, 0x44):
        return 0, pos + 1
    if code in (0x52, 0x53):
        return buf[pos + 1], pos + 2
    if code == 0x55:
        return _I8.unpack_from(buf, pos + 1)[0], pos + 2
    if code == 0x54:
        return Int(_I8.unpack_from(buf, pos + 1)[0]), pos + 2
    if code == 0x51:
        return Byte(_I8.unpack_from(buf, pos + 1)[0]), pos + 2
    if code == 0x50:
        return Short(buf[pos + 1]), pos + 2
    if code == 0x71:
        return Int(_I32.unpack_from(buf, pos + 1)[0]), pos + 5
    if code == 0x70:
        return _U32.unpack_from(buf, pos + 1)[0], pos + 5
    if code == 0x80:
        return _U64.unpack_from(buf, pos + 1)[0], pos + 9
    if code == 0x82:
        return _F64.unpack_from(buf, pos + 1)[0], pos + 9
    if code == 0x72:
        return Float32(_F32.unpack_from(buf, pos + 1)[0]), pos + 5
    if code == 0x60:
        return Int(_U16.unpack_from(buf, pos + 1)[0]), pos + 3
    if code == 0x61:
        return Short(_I16.unpack_from(buf, pos + 1)[0]), pos + 3
    if code == 0x56:
        return buf[pos + 1] != 0, pos + 2
    if code == 0x98:
        if pos + 17 > len(buf):
            raise DecodeError("a uuid runs past the end of the message")
        return uuid.UUID(bytes=buf[pos + 1 : pos + 17]), pos + 17
    if code == 0x73:
        return _char(_U32.unpack_from(buf, pos + 1)[0]), pos + 5
    if code == 0xB0:
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        return buf[pos + 5 : end], end
    if code == 0xB1:
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        return _text(buf, pos + 5, end), end
    if code == 0xB3:
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        return Symbol(_text(buf, pos + 5, end)), end
    if code == 0xD0 or code == 0xD1:
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        items = _items(buf, pos + 9, end, _U32.unpack_from(buf, pos + 5)[0])
        return (items if code == 0xD0 else _pairs(items)), end
    if code in (0x74, 0x84, 0x94):
        return _decimal(buf, pos)
    if code == 0x00:
        descriptor, value_pos = _value(buf, pos + 1)
        value, end = _value(buf, value_pos)
        return Described(cast("Value", descriptor), cast("Value", value)), end
    decoded, end = decode(buf, pos)
    return cast("Field", decoded), end


def _text(buf: bytes, start: int, end: int) -> str:
    if end > len(buf):
        raise DecodeError("a string runs past the end of the message")
    return buf[start:end].decode()


def _items(buf: bytes, pos: int, end: int, count: int) -> list[Field]:
    if end > len(buf):
        raise DecodeError("a compound value runs past the end of the message")
    items: list[Field] = []
    append = items.append
    for _ in range(count):
        if pos >= end:
            raise DecodeError("a compound value has fewer items than its count")
        value, pos = _value(buf, pos)
        append(value)
    if pos > end:
        raise DecodeError("an item runs past the end of its compound value")
    return items


def _pairs(items: list[Field]) -> dict[Field, Field]:
    if len(items) % 2:
        raise DecodeError("a map has an odd number of items")
    keys = items[0::2]
    for key in keys:
        if isinstance(key, list | dict):
            raise DecodeError("a map key is a compound value")
    return dict(zip(keys, items[1::2], strict=True))


def _char(code_point: int) -> str:
    try:
        return chr(code_point)
    except ValueError:
        raise DecodeError(f"char U+{code_point:X} is not a Unicode code point") from None


# IEEE 754-2008 decimals in the binary integer encoding (AMQP 1.0 §1.6.17-19), by constructor:
# bytes, the exponent continuation's width w (the combination field has w + 5 bits), the bias.
_DECIMALS: Final = {0x74: (4, 6, 101), 0x84: (8, 8, 398), 0x94: (16, 12, 6176)}


def _decimal(buf: bytes, pos: int) -> tuple[Decimal, int]:
    """A decimal32/64/128 as Python's ``Decimal`` (infinities and NaNs included)."""
    width, w, bias = _DECIMALS[buf[pos]]
    end = pos + 1 + width
    if end > len(buf):
        raise DecodeError("a decimal runs past the end of the message")
    bits = int.from_bytes(buf[pos + 1 : end], "big")
    total = width * 8
    trailing_bits = total - 1 - (w + 5)
    sign = bits >> (total - 1)
    combination = (bits >> trailing_bits) & ((1 << (w + 5)) - 1)
    trailing = bits & ((1 << trailing_bits) - 1)
    if combination >> (w + 3) == 0b11:
        if (combination >> (w + 1)) & 0b11 == 0b11:
            special = "NaN" if (combination >> w) & 1 else "Infinity"
            return Decimal(("-" if sign else "") + special), end
        exponent = (combination >> 1) & ((1 << (w + 2)) - 1)
        coefficient = ((0b1000 | (combination & 1)) << trailing_bits) | trailing
    else:
        exponent = combination >> 3
        coefficient = ((combination & 0b111) << trailing_bits) | trailing
    digits = tuple(int(digit) for digit in str(coefficient))
    return Decimal((sign, digits, exponent - bias)), end


# -- writing ---------------------------------------------------------------------------------


class EncodeError(ValueError):
    """A value no AMQP type holds (an integer beyond 64 bits, a type with no counterpart)."""


_DURABLE_HEADER: Final = b"\x00\x53\x70\xc0\x02\x01\x41"
_SECTION: Final = b"\x00\x53"
_NULL: Final = b"\x40"
_INT_TYPES: Final[dict[type, tuple[int, struct.Struct]]] = {
    Byte: (0x51, _I8),
    Short: (0x61, _I16),
    Int: (0x71, _I32),
}


def _variable(raw: bytes, small: int, large: int) -> bytes:
    if len(raw) < 256:
        return bytes((small, len(raw))) + raw
    return bytes((large,)) + _U32.pack(len(raw)) + raw


def _compound(items: list[bytes], count: int, small: int, large: int) -> bytes:
    body = b"".join(items)
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((large,)) + _U32.pack(len(body) + 4) + _U32.pack(count) + body


def encode_value(value: object) -> bytes:
    """A value with the AMQP type a client means by it: ``int`` a long, ``float`` a double,
    ``str`` a string, and the wrappers here and in the codec (:class:`Symbol`,
    :class:`Timestamp`, :class:`Float32`, :class:`Byte`, :class:`Short`, :class:`Int`) theirs.
    """
    if isinstance(value, str):
        if isinstance(value, Symbol):
            return _variable(value.encode(), 0xA3, 0xB3)
        return _variable(value.encode(), 0xA1, 0xB1)
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return b"\x41" if value else b"\x42"
    if isinstance(value, int):
        if isinstance(value, Timestamp):
            return b"\x83" + _I64.pack(value)
        sized = _INT_TYPES.get(type(value))
        if sized is not None:
            return bytes((sized[0],)) + sized[1].pack(value)
        if -128 <= value < 128:
            return b"\x55" + _I8.pack(value)
        if -(1 << 63) <= value < 1 << 63:
            return b"\x81" + _I64.pack(value)
        if 0 <= value < 1 << 64:
            return b"\x80" + _U64.pack(value)  # a ulong (what a read gives for one)
        raise EncodeError(f"{value} fits no AMQP integer type")
    if isinstance(value, float):
        if isinstance(value, Float32):
            return b"\x72" + _F32.pack(value)
        return b"\x82" + _F64.pack(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _variable(bytes(value), 0xA0, 0xB0)
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, Decimal):
        return _encode_decimal128(value)
    if isinstance(value, list | tuple):
        items = [encode_value(item) for item in value]
        return _compound(items, len(items), 0xC0, 0xD0) if items else b"\x45"
    if isinstance(value, dict):
        pairs = [encode_value(part) for pair in value.items() for part in pair]
        return _compound(pairs, len(pairs), 0xC1, 0xD1)
    if isinstance(value, Described):
        return b"\x00" + encode_value(value.descriptor) + encode_value(value.value)
    raise EncodeError(f"no AMQP type for a value of type {type(value).__name__}")


_DECIMAL128_BIAS: Final = 6176
_DECIMAL128_DIGITS: Final = 34


def _encode_decimal128(value: Decimal) -> bytes:
    """A decimal128 in the binary integer encoding (34 digits; beyond that, rounded)."""
    if not value.is_finite():
        special = 0x7C if value.is_nan() else 0x78
        return b"\x94" + bytes((special | (0x80 if value.is_signed() else 0),)) + bytes(15)
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if len(digits) > _DECIMAL128_DIGITS:
        value = Context(prec=_DECIMAL128_DIGITS).plus(value)
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
    coefficient = int("".join(map(str, digits)) or "0")
    biased = exponent + _DECIMAL128_BIAS
    if not 0 <= biased < 3 * (1 << 12):
        raise EncodeError(f"decimal {value} is out of decimal128's range")
    # A coefficient of at most 34 digits is below 2**113: the combination field's first form.
    bits = (sign << 127) | (biased << 113) | coefficient
    return b"\x94" + bits.to_bytes(16, "big")


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
    """A message with a data-section body, as a client publishes it (AMQP 1.0 §3.2)."""
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
        sections.append(_SECTION + b"\x73" + _compound(fields, len(fields), 0xC0, 0xD0))
    if application_properties:
        sections.append(_SECTION + b"\x74" + encode_value(application_properties))
    sections.append(_SECTION + b"\x75" + _variable(body, 0xA0, 0xB0))
    return b"".join(sections)
