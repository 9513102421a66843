"""Application properties as Spark variants: checked against PySpark's own variant reader."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.variant_utils import VariantUtils as _VariantUtils

from sluicegate.spark.variant import decode_variant, encode_object, encode_string_objects
from sluicegate.wire.amqp_types import Byte, Float32, Int, Short, Symbol, Timestamp

# PySpark annotates its reader as returning a str; it returns Python values.
VariantUtils: Any = _VariantUtils
_SCALARS = st.one_of(
    st.text(max_size=100),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.binary(max_size=100),
    st.integers(-128, 127).map(Byte),
    st.integers(-(2**15), 2**15 - 1).map(Short),
    st.integers(-(2**31), 2**31 - 1).map(Int),
    # Up to the end of year 9999, the last a Python datetime (PySpark's reader) holds.
    st.integers(0, 253_402_300_799_999).map(Timestamp),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=4, max_value=10**20, min_value=-(10**20)
    ),
)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=10)


def _as_spark(value: Any) -> Any:
    """What PySpark's reader gives for a value this module encoded."""
    if isinstance(value, Timestamp):
        return _EPOCH + datetime.timedelta(milliseconds=value)
    if isinstance(value, list):
        return [_as_spark(item) for item in value]
    return value


@given(st.dictionaries(st.text(max_size=30), _VALUES, max_size=10))
def test_pyspark_reads_what_is_encoded(properties: dict[str, Any]) -> None:
    value, metadata = encode_object(properties)
    read = VariantUtils.to_python(value, metadata)
    assert read == {key: _as_spark(item) for key, item in properties.items()}


@given(st.dictionaries(st.text(max_size=30), _VALUES, max_size=10))
def test_the_sink_reads_back_the_same_values_with_their_widths(properties: dict[str, Any]) -> None:
    value, metadata = encode_object(properties)
    decoded = decode_variant(value, metadata)
    assert decoded == properties
    assert isinstance(decoded, dict)
    for key, item in properties.items():
        if isinstance(item, Byte | Short | Int | Timestamp):
            assert type(decoded[key]) is type(item)


def test_symbols_uuids_and_floats_and_big_ulongs() -> None:
    properties = {
        "s": Symbol("sym"),
        "u": uuid.UUID(int=7),
        "f": Float32(2.5),
        "big": 2**63 + 5,
        "nested": {"a": 1},
    }
    value, metadata = encode_object(properties)
    assert VariantUtils.to_python(value, metadata) == {
        "s": "sym",
        "u": "00000000-0000-0000-0000-000000000007",
        "f": 2.5,
        "big": Decimal(2**63 + 5),
        "nested": "{'a': 1}",
    }
    decoded: Any = decode_variant(value, metadata)
    assert type(decoded["f"]) is Float32


def test_a_key_repeated_keeps_its_last_value_and_layouts_are_shared() -> None:
    first = encode_object({"b": 1, "a": "x"})
    second = encode_object({"b": 2, "a": "y"})
    assert first[1] is second[1]  # one metadata for the same keys
    assert VariantUtils.to_python(*second) == {"a": "y", "b": 2}


@given(
    st.lists(st.text(max_size=12), min_size=1, max_size=6, unique=True),
    st.data(),
)
def test_rows_of_string_values_encode_column_wise_as_row_by_row(
    keys: list[str], data: st.DataObject
) -> None:
    """The column-wise encoder makes each row's bytes exactly, or leaves the rows to
    encode_object (a value over 63 bytes, 256 bytes of values or more)."""
    rows = data.draw(
        st.lists(st.lists(st.text(max_size=70), min_size=len(keys), max_size=len(keys)), min_size=1)
    )
    strings = pa.array([value for row in rows for value in row], pa.string())
    encoded = encode_string_objects(tuple(keys), strings)
    expected = [encode_object(dict(zip(keys, row, strict=True))) for row in rows]
    sizes = [[len(value.encode()) for value in row] for row in rows]
    fits = all(max(row) <= 63 and sum(row) + len(row) < 256 for row in sizes)
    assert (encoded is not None) == fits
    if encoded is not None:
        values, metadata = encoded
        assert values.to_pylist() == [value for value, _ in expected]
        assert all(metadata == keys_metadata for _, keys_metadata in expected)
