"""AMQP messages as rows: the read schema, and encoded messages decoded into Arrow record batches.

Spark moves a ``pyarrow.RecordBatch`` to the JVM without looking at each value, about twice as
fast as Python tuples (docs/spark.md), so the readers build columns and yield batches.
Each message is decoded once by proton; its body is copied into the batch as bytes.
"""

from __future__ import annotations

import json
from typing import Any, Final

import pyarrow as pa
from cproton import pn_message_get_content_type
from proton import Message
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# The columns a read produces, in order: the body, the immutable properties a pipeline keys on,
# the application's and the broker's annotations, and where the message came from.
SCHEMA: Final = StructType(
    [
        StructField("body", BinaryType()),
        StructField("message_id", StringType()),
        StructField("correlation_id", StringType()),
        StructField("subject", StringType()),
        StructField("content_type", StringType()),
        StructField("creation_time", TimestampType()),
        StructField("application_properties", MapType(StringType(), StringType())),
        StructField("message_annotations", MapType(StringType(), StringType())),
        StructField("delivery_count", IntegerType()),
        StructField("offset", LongType()),
    ]
)
# The layout Spark checks every batch against (its own conversion, so the two always agree).
ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
# Rows per record batch: large enough to amortise Arrow's per-batch cost, small enough that a
# batch of 1 MiB messages stays a reasonable allocation.
BATCH_ROWS: Final = 10_000
STREAM_OFFSET_ANNOTATION: Final = "x-stream-offset"


def _text(value: object) -> str | None:
    """A property or annotation value as a string column value (binary ids as hex)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def _body(value: object) -> bytes | None:
    """The body as bytes: data sections as they are, an amqp-value string as UTF-8, others JSON.

    JSON keeps maps and lists readable with Spark's ``from_json``.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, default=_text).encode()


def _pairs(mapping: dict[Any, Any] | None) -> list[tuple[str, str | None]] | None:
    if not mapping:
        return None
    return [(str(key), _text(value)) for key, value in mapping.items()]


class BatchBuilder:
    """Columns of decoded messages, cut into record batches of at most ``BATCH_ROWS``."""

    def __init__(self) -> None:
        self._message = Message()
        self._batches: list[pa.RecordBatch] = []
        self._reset()

    def _reset(self) -> None:
        self._columns: list[list[Any]] = [[] for _ in ARROW_SCHEMA]

    def add(self, payload: bytes, offset: int | None, below: int | None = None) -> int | None:
        """Decode one encoded message into a row; return its ``x-stream-offset`` if it has one.

        ``offset`` None takes the row's offset from that annotation (a stream read), and then a
        message at or beyond ``below`` is not added (it belongs to the next range).
        """
        message = self._message
        message.decode(payload)
        annotations = message.annotations
        found = annotations.get(STREAM_OFFSET_ANNOTATION) if annotations else None
        stream_offset = found if isinstance(found, int) else None
        if offset is None:
            if stream_offset is None or (below is not None and stream_offset >= below):
                return stream_offset
            offset = stream_offset
        created = message.creation_time
        (
            body,
            message_id,
            correlation_id,
            subject,
            content_type,
            creation_time,
            application_properties,
            message_annotations,
            delivery_count,
            offsets,
        ) = self._columns
        body.append(_body(message.body))
        message_id.append(_text(message.id))
        correlation_id.append(_text(message.correlation_id))
        subject.append(message.subject)
        # proton's content_type property turns an absent value into the symbol 'None'.
        content_type.append(pn_message_get_content_type(message._msg))
        creation_time.append(int(created * 1_000_000) if created else None)
        application_properties.append(_pairs(message.properties))
        message_annotations.append(_pairs(annotations))
        delivery_count.append(message.delivery_count)
        offsets.append(offset)
        if len(body) >= BATCH_ROWS:
            self._cut()
        return stream_offset

    def _cut(self) -> None:
        if self._columns[0]:
            arrays = [
                pa.array(column, type=field.type)
                for column, field in zip(self._columns, ARROW_SCHEMA, strict=True)
            ]
            self._batches.append(pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA))
            self._reset()

    def finish(self) -> list[pa.RecordBatch]:
        """Every batch built so far, including the last partial one; the builder starts over."""
        self._cut()
        batches, self._batches = self._batches, []
        return batches
