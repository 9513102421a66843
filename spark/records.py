"""AMQP messages as rows: the read schema, and encoded messages decoded into Arrow record batches.

Spark moves a ``pyarrow.RecordBatch`` to the JVM without looking at each value, about twice as fast
as Python tuples (docs/spark.md), so the readers build columns and yield batches. Each message is
decoded once, by ``spark/message_fields.py`` (several times faster than ``proton.Message``),
straight into one list per column (``FieldColumns``: no object per row, and the fields a read
does not ask for skipped); the application properties are laid end to end (offsets, keys,
values) and handed to Arrow in one call per batch, and string properties that share one layout
(a stream's usual rows) become variants column-wise in Arrow.

A read may name fewer columns than :data:`SCHEMA` (``spark.read.schema("body binary, offset
long")``): only those are built, which saves the Python and the JVM side the work of the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cached_property
from itertools import accumulate, chain, islice, pairwise
from operator import eq, methodcaller
from types import MappingProxyType
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    VariantType,
)

from sluicegate.spark.field_columns import COLUMN_FIELDS, FieldColumns
from sluicegate.spark.options import OptionError
from sluicegate.spark.variant import encode_object, encode_string_objects
from sluicegate.wire.amqp_types import Symbol
from sluicegate.wire.annotations import X_STREAM_OFFSET

# The columns a read produces, in order: the body, the immutable properties a pipeline keys on,
# the application's properties (as strings, and typed), the broker's annotations, what the
# gateway says about earlier deliveries, and where the message came from.
SCHEMA: Final = StructType(
    [
        StructField("body", BinaryType()),
        StructField("message_id", StringType()),
        StructField("correlation_id", StringType()),
        StructField("subject", StringType()),
        StructField("content_type", StringType()),
        StructField("creation_time", TimestampType()),
        StructField("application_properties", MapType(StringType(), StringType())),
        StructField("application_properties_typed", VariantType()),
        StructField("message_annotations", MapType(StringType(), StringType())),
        StructField("delivery_count", IntegerType()),
        StructField("redelivered", BooleanType()),
        StructField("offset", LongType()),
    ]
)
COLUMNS: Final = tuple(field.name for field in SCHEMA.fields)
_TYPES: Final = {field.name: field.dataType for field in SCHEMA.fields}
# Rows per record batch: large enough to amortise Arrow's per-batch cost, small enough that a
# batch of 1 MiB messages stays a reasonable allocation.
BATCH_ROWS: Final = 10_000
STREAM_OFFSET_ANNOTATION: Final = str(X_STREAM_OFFSET)


def read_columns(schema: StructType | None) -> tuple[str, ...]:
    """The columns a read with ``schema`` builds: all of :data:`SCHEMA`, or the ones named.

    A user-given schema may leave columns out and reorder them, but each column it names must
    be one of the connector's, with the connector's type.
    """
    if schema is None or schema == SCHEMA:
        return COLUMNS
    names: list[str] = []
    for field in schema.fields:
        expected = _TYPES.get(field.name)
        if expected is None:
            known = ", ".join(COLUMNS)
            raise OptionError(
                f"schema: no column {field.name!r} in a sluicegate read; known: {known}"
            )
        if field.dataType != expected:
            raise OptionError(
                f"schema: column {field.name} is {expected.simpleString()} in a sluicegate read, "
                f"not {field.dataType.simpleString()}"
            )
        names.append(field.name)
    return tuple(names)


def _text(value: object) -> str | None:
    """A property or annotation value as a string column value (binary as hex)."""
    if value is None or (isinstance(value, str) and type(value) is str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def _body(value: object) -> bytes | None:
    """The body as bytes: data sections as they are, an amqp-value string as UTF-8, others JSON.

    JSON keeps maps and lists readable with Spark's ``from_json``.
    """
    if value is None or (isinstance(value, bytes) and type(value) is bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return json.dumps(value, default=_text).encode()


# A row without a map, as the flat lists take it: no entries (shared, never changed).
_NO_ENTRIES: Final[Mapping[Any, Any]] = MappingProxyType({})
_VALUES: Final = methodcaller("values")


class _FlatMaps:
    """Maps laid end to end, as Arrow takes a map column: where each row's entries end (after
    a leading 0), the keys, the values; a row without entries is a null map.

    The keys and values are converted to strings only when some are not strings already:
    string properties, the usual case, pass untouched.
    """

    def __init__(self, ends: list[int], keys: list[Any], values: list[Any]) -> None:
        self.offsets = ends
        self.keys = keys
        self.values = values
        self.nulls = list(map(eq, ends, islice(ends, 1, None)))

    @classmethod
    def of(cls, mappings: list[Mapping[Any, Any] | None]) -> _FlatMaps:
        """The maps of ``mappings`` (None: a null map), gathered by C loops over the rows."""
        present = [mapping or _NO_ENTRIES for mapping in mappings]
        return cls(
            list(accumulate(map(len, present), initial=0)),
            list(chain.from_iterable(present)),
            list(chain.from_iterable(map(_VALUES, present))),
        )

    @property
    def mappings(self) -> list[dict[Any, Any] | None]:
        """Each row's map (None where it has no entries)."""
        keys, values = self.keys, self.values
        return [
            dict(zip(keys[start:end], values[start:end], strict=True)) if end > start else None
            for start, end in pairwise(self.offsets)
        ]

    @cached_property
    def text_values(self) -> bool:
        return _TEXT_TYPES.issuperset(map(type, self.values))

    @cached_property
    def text_keys(self) -> bool:
        return _TEXT_TYPES.issuperset(map(type, self.keys))

    @cached_property
    def value_array(self) -> pa.Array:
        values = self.values
        if not self.text_values:
            values = [value if type(value) in _TEXT_TYPES else _text(value) for value in values]
        return pa.array(values, pa.string())

    def map_array(self, arrow_type: pa.DataType) -> pa.Array:
        """A ``map<string,string>`` column."""
        keys = self.keys
        if not self.text_keys:
            keys = [key if isinstance(key, str) else str(key) for key in keys]
        return pa.MapArray.from_arrays(
            pa.array(self.offsets, pa.int32()),
            pa.array(keys, pa.string()),
            self.value_array,
            type=arrow_type,
            mask=pa.array(self.nulls, pa.bool_()),
        )

    def shared_keys(self) -> tuple[str, ...] | None:
        """The keys, if every row has the same string keys in the same order.

        The keys laid end to end repeating the first row's is enough: a row's keys are
        distinct, so no row can hold more of them than the first, hence none holds fewer.
        """
        rows = len(self.nulls)
        count = self.offsets[1] if rows else 0
        if not count or not self.text_keys:
            return None
        first = self.keys[:count]
        return tuple(first) if self.keys == first * rows else None


def _shared_map_array(
    mappings: list[Mapping[Any, Any] | None], arrow_type: pa.DataType
) -> pa.Array:
    """A ``map<string,string>`` column whose rows mostly share a few mapping objects, as a
    stream's or a queue's messages share their annotations (``spark/message_fields.py`` decodes
    each distinct map once): each distinct object is converted once, and rows take it by index.
    """
    ids = list(map(id, mappings))
    distinct = dict(zip(ids, mappings, strict=True))
    if len(distinct) * 2 > len(ids):
        return _FlatMaps.of(mappings).map_array(arrow_type)
    position = {key: index for index, key in enumerate(distinct)}
    indices = pa.array(list(map(position.__getitem__, ids)), pa.int32())
    return _FlatMaps.of(list(distinct.values())).map_array(arrow_type).take(indices)


# What Arrow takes as a string as it is: a symbol is a ``str`` subclass.
_TEXT_TYPES: Final = frozenset({str, Symbol})


def _variant_array(flat: _FlatMaps, arrow_type: pa.DataType) -> pa.Array:
    """A ``variant`` column: the struct of value and metadata binaries Spark takes.

    Rows of one layout of string values, a stream's usual rows, are encoded column-wise.
    """
    fields = list(arrow_type)
    keys = flat.shared_keys()
    if keys is not None and flat.text_values:
        encoded = encode_string_objects(keys, flat.value_array)
        if encoded is not None:
            column, shared = encoded
            repeated = pa.repeat(pa.scalar(shared, pa.binary()), len(flat.nulls))
            return pa.StructArray.from_arrays([column, repeated], fields=fields)
    values: list[bytes] = []
    metadata: list[bytes] = []
    nulls: list[bool] = []
    for mapping in flat.mappings:
        if mapping:
            value, keys_metadata = encode_object(mapping)
            values.append(value)
            metadata.append(keys_metadata)
            nulls.append(False)
        else:
            values.append(b"")
            metadata.append(b"")
            nulls.append(True)
    return pa.StructArray.from_arrays(
        [pa.array(values, pa.binary()), pa.array(metadata, pa.binary())],
        fields=fields,
        mask=pa.array(nulls, pa.bool_()),
    )


def _texts(values: list[Any]) -> list[str | None]:
    """Ids as strings: most are strings already and pass as they are."""
    return [value if value is None or type(value) is str else _text(value) for value in values]


def _bodies(values: list[Any]) -> list[bytes | None]:
    """Bodies as bytes: most are a data section's already and pass as they are."""
    return [value if value is None or type(value) is bytes else _body(value) for value in values]


_PROPERTY_COLUMNS: Final = frozenset({"application_properties", "application_properties_typed"})


class BatchBuilder:
    """Encoded messages, decoded into record batches of at most ``BATCH_ROWS`` column by column.

    ``stream`` rows take their offset from each message's ``x-stream-offset`` and are never
    ``redelivered`` (offsets identify them); other rows are numbered, and are ``redelivered``
    when the gateway counted an earlier delivery (``delivery_count > 0``).
    """

    def __init__(self, columns: tuple[str, ...] = COLUMNS, *, stream: bool = False) -> None:
        self.columns = columns
        self.stream = stream
        self.schema = to_arrow_schema(
            StructType([StructField(name, _TYPES[name]) for name in columns]), timezone="UTC"
        )
        self._batches: list[pa.RecordBatch] = []
        # The typed properties column is built from the same fields as the string map.
        fields = {
            "application_properties" if name in _PROPERTY_COLUMNS else name for name in columns
        }
        self._rows = FieldColumns(COLUMN_FIELDS.intersection(fields))

    @property
    def rows(self) -> int:
        """Rows added since the last batch was cut."""
        return len(self._rows)

    def add_stream(
        self, payloads: Iterable[bytes | bytearray | memoryview], below: int | None = None
    ) -> list[int | None]:
        """Decode a stream's messages into rows; return each one's ``x-stream-offset``.

        A message without one, or at or beyond ``below`` (it belongs to the next range), is
        not added.
        """
        assert self.stream
        found = self._rows.add_stream(payloads, below)
        self._cut_full()
        return found

    def add_numbered(self, payloads: Iterable[bytes | bytearray | memoryview], first: int) -> None:
        """Decode messages into rows whose offsets count up from ``first``."""
        self._rows.add_numbered(payloads, first)
        self._cut_full()

    def _cut_full(self) -> None:
        while len(self._rows) >= BATCH_ROWS:
            self._cut(self._rows.split(BATCH_ROWS))

    def _column(
        self, name: str, arrow_type: pa.DataType, rows: FieldColumns, properties: _FlatMaps | None
    ) -> pa.Array:
        if name == "body":
            return pa.array(_bodies(rows.body), arrow_type)
        if name == "offset":
            return pa.array(rows.offset, arrow_type)
        if name == "application_properties":
            assert properties is not None
            return properties.map_array(arrow_type)
        if name == "message_annotations":
            # But x-stream-offset, the offset column already: a stream stamps it on every
            # message, it would make every row's map non-empty, and maps are what Spark
            # converts slowest.
            return _shared_map_array(rows.other_annotations, arrow_type)
        if name == "application_properties_typed":
            assert properties is not None
            return _variant_array(properties, arrow_type)
        if name == "redelivered":
            if self.stream:
                return pa.array([False] * len(rows), arrow_type)
            return pa.array([count > 0 for count in rows.delivery_count], arrow_type)
        if name == "delivery_count":
            return pa.array(rows.delivery_count, arrow_type)
        values = getattr(rows, name)
        if name in ("message_id", "correlation_id"):
            return pa.array(_texts(values), arrow_type)
        if name == "creation_time":
            return pa.array([None if t is None else t * 1000 for t in values], arrow_type)
        return pa.array(values, arrow_type)

    def _cut(self, rows: FieldColumns) -> None:
        if not len(rows):
            return
        properties = (
            _FlatMaps(rows.property_ends, rows.property_keys, rows.property_values)
            if _PROPERTY_COLUMNS.intersection(self.columns)
            else None
        )
        arrays = [self._column(field.name, field.type, rows, properties) for field in self.schema]
        self._batches.append(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def full_batches(self) -> list[pa.RecordBatch]:
        """The batches of ``BATCH_ROWS`` rows built so far (the partial one stays)."""
        batches, self._batches = self._batches, []
        return batches

    def finish(self) -> list[pa.RecordBatch]:
        """Every batch built so far, including the last partial one; the builder starts over."""
        self._cut(self._rows.split(len(self._rows)))
        batches, self._batches = self._batches, []
        return batches
