"""Many messages' fields decoded straight into one list per field, for columnar batches.

The Spark connector builds Arrow batches: a column per field, no object per message, and only
the fields a read asks for (``spark/records.py``). A message laid out as a stream's or a queue's
usually are is read here inline; any other through :func:`read_fields`.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Mapping
from typing import Final, TypeAlias

from sluicegate.spark.field_values import I64, U32, Field
from sluicegate.spark.message_annotations import OFFSET_BYTES
from sluicegate.spark.message_fields import (
    REUSED,
    MessageFields,
    known_values,
    read_application_properties,
    read_fields,
    read_properties,
)
from sluicegate.wire.amqp_types import Timestamp
from sluicegate.wire.decoding import skip
from sluicegate.wire.errors import DecodeError

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
# The columns of one item per row (the application properties are laid out otherwise).
_ROW_COLUMNS: Final = ("offset", "delivery_count", "other_annotations", "body", *_PROPERTY_FIELDS)
# The sections after a lead as a sender usually writes them, by their small-ulong descriptors.
_PROPERTIES_SECTION: Final = b"\x00\x53\x73"
_APPLICATION_SECTION: Final = b"\x00\x53\x74"
_DATA8_SECTION: Final = b"\x00\x53\x75\xa0"
_DATA32_SECTION: Final = b"\x00\x53\x75\xb0"

# A row's fields but its offset, delivery-count and annotations: the body, the five properties,
# and its application properties (a map; or, in the last message's layout, keys and values).
_Row: TypeAlias = tuple[
    Field,
    Field,
    Field,
    str | None,
    str | None,
    Timestamp | None,
    dict[Field, Field] | None,
    tuple[Field, ...],
    list[Field] | tuple[()],
]


class FieldColumns:
    """Many messages' fields decoded straight into one list per field (a column).

    A message laid out as a stream's or a queue's usually are, the lead the last message
    started with (see ``spark/message_fields.py``'s ``Lead``) then any of properties,
    application properties and one data section in that order, is read inline, the sections
    whose fields are not asked for skipped by their size, unchecked (where :func:`read_fields`
    checks every value); any other message goes through :func:`read_fields`. Either way a
    column holds what :func:`read_fields` gives for that field.

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
        self._want_body = "body" in self.fields
        self._want_properties = not self.fields.isdisjoint(_PROPERTY_FIELDS)
        self._want_application = "application_properties" in self.fields
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
        found: list[int | None] = []
        note = found.append
        want_body, want_properties = self._want_body, self._want_properties
        add_offset, add_count = self.offset.append, self.delivery_count.append
        add_annotations, add_body = self.other_annotations.append, self.body.append
        add_id, add_correlation = self.message_id.append, self.correlation_id.append
        add_subject, add_type = self.subject.append, self.content_type.append
        add_created = self.creation_time.append
        want_application, add_end = self._want_application, self.property_ends.append
        keys, values = self.property_keys, self.property_values
        number = 0 if first is None else first - 1
        for payload in payloads:
            number += 1
            buf = payload if type(payload) is bytes else bytes(payload)
            lead = REUSED.lead
            fields: MessageFields | None = None
            if lead is not None and buf.startswith(lead.prefix) and lead.skipped <= len(buf):
                _, pos, _, delivery_count, known, stamped = lead
                others = known.view
                stream_offset = I64.unpack_from(buf, pos - OFFSET_BYTES)[0] if stamped else None
            else:
                fields = read_fields(buf)
                stream_offset = fields.stream_offset
            if first is None:
                note(stream_offset)
                if stream_offset is None or (below is not None and stream_offset >= below):
                    continue
            row = None if fields is not None else self._after_lead(buf, pos)
            if row is None:
                # Another layout, or a malformed message: read_fields says which.
                if fields is None:
                    fields = read_fields(buf)
                delivery_count, others = fields.delivery_count, fields.other_annotations
                row = _row_of(fields)
            add_offset(number if first is not None else stream_offset)  # type: ignore[arg-type]
            add_count(delivery_count)
            add_annotations(others)
            if want_body:
                add_body(row[0])
            if want_properties:
                add_id(row[1])
                add_correlation(row[2])
                add_subject(row[3])
                add_type(row[4])
                add_created(row[5])
            if want_application:
                if row[6]:
                    keys.extend(row[6])
                    values.extend(row[6].values())
                elif row[7]:
                    keys.extend(row[7])
                    values.extend(row[8])
                add_end(len(keys))
        return found

    def _after_lead(self, buf: bytes, pos: int) -> _Row | None:
        """The row of a message whose sections after its lead (at ``pos``) are laid out as
        usual, the fields not asked for skipped unread; None for any other message."""
        message_id: Field = None
        correlation_id: Field = None
        subject: str | None = None
        content_type: str | None = None
        created: Timestamp | None = None
        application: dict[Field, Field] | None = None
        body: Field = None
        property_keys: tuple[Field, ...] = ()
        property_values: list[Field] | tuple[()] = ()
        try:
            if buf.startswith(_PROPERTIES_SECTION, pos):
                if not self._want_properties:
                    # Skipped by its size: a list8's in its second byte.
                    pos = pos + 5 + buf[pos + 4] if buf[pos + 3] == 0xC0 else skip(buf, pos + 3)
                elif buf[pos + 3] == 0xC0 and buf[pos + 5] == 1 and buf[pos + 6] == 0xA1:
                    # A list of one item, a string message-id: the usual properties.
                    end = pos + 5 + buf[pos + 4]
                    item = pos + 8 + buf[pos + 7]
                    message_id = buf[pos + 8 : item].decode()
                    pos = end if item <= end else -1
                else:
                    properties, pos = read_properties(buf, pos + 3)
                    message_id, correlation_id, subject, content_type, created = properties
            if buf.startswith(_APPLICATION_SECTION, pos):
                if not self._want_application:
                    pos = pos + 5 + buf[pos + 4] if buf[pos + 3] == 0xC1 else skip(buf, pos + 3)
                elif (known := known_values(buf, pos + 3, REUSED.keys)) is None:
                    application, pos = read_application_properties(buf, pos + 3)
                else:
                    property_keys, (property_values, pos) = REUSED.keys.names, known
            if buf.startswith(_DATA8_SECTION, pos):
                end = pos + 5 + buf[pos + 4]
                body = buf[pos + 5 : end] if self._want_body else None
            elif buf.startswith(_DATA32_SECTION, pos):
                end = pos + 8 + U32.unpack_from(buf, pos + 4)[0]
                body = buf[pos + 8 : end] if self._want_body else None
            else:
                return None
        except (DecodeError, IndexError, struct.error, UnicodeDecodeError):
            return None
        if end != len(buf):
            return None
        return (
            body,
            message_id,
            correlation_id,
            subject,
            content_type,
            created,
            application,
            property_keys,
            property_values,
        )


def _row_of(fields: MessageFields) -> _Row:
    """A row as :func:`read_fields` read it."""
    return (
        fields.body,
        fields.message_id,
        fields.correlation_id,
        fields.subject,
        fields.content_type,
        fields.creation_time,
        fields.application_properties,
        (),
        (),
    )
