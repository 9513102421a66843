"""Encoded messages as Arrow rows: the string maps keep every value, whatever its AMQP type."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.spark import records
from sluicegate.spark.message_encoding import encode_message
from sluicegate.spark.message_fields import read_fields
from sluicegate.spark.records import COLUMNS, BatchBuilder
from sluicegate.spark.variant import encode_object
from sluicegate.wire.amqp_types import Int, Symbol, Timestamp
from sluicegate.wire.annotations import stamp_stream_offset

# The annotations the gateway stores a message with.
_ROUTED: dict[Symbol, object] = {Symbol("x-exchange"): "", Symbol("x-routing-key"): "k"}


def _rows(payloads: list[bytes], *, stream: bool) -> list[dict[str, Any]]:
    builder = BatchBuilder(stream=stream)
    if stream:
        builder.add_stream(payloads)
    else:
        builder.add_numbered(payloads, 0)
    return [row for batch in builder.finish() for row in batch.to_pylist()]


def test_property_and_annotation_values_of_every_kind_become_their_strings() -> None:
    payload = encode_message(
        b"body",
        durable=True,
        message_id="m-1",
        application_properties={
            "text": "eu",
            "symbol": Symbol("sym"),
            "long": 7,
            "int": Int(-3),
            "flag": True,
            "binary": b"\x01\xff",
            "nothing": None,
            "when": Timestamp(1_700_000_000_123),
        },
        message_annotations={Symbol("x-opt-tag"): "t", Symbol("x-opt-n"): 5},
    )
    (row,) = _rows([payload], stream=False)
    assert dict(row["application_properties"]) == {
        "text": "eu",
        "symbol": "sym",
        "long": "7",
        "int": "-3",
        "flag": "True",
        "binary": "01ff",
        "nothing": None,
        "when": "1700000000123",
    }
    assert dict(row["message_annotations"]) == {"x-opt-tag": "t", "x-opt-n": "5"}
    assert (row["message_id"], row["offset"], row["redelivered"]) == ("m-1", 0, False)


@given(
    st.lists(
        st.dictionaries(
            st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1))
        ),
        min_size=1,
        max_size=20,
    )
)
def test_stream_rows_keep_each_messages_own_map_and_offset(
    properties: list[dict[str, Any]],
) -> None:
    """Rows with maps of strings, of other values and none at all, side by side in one batch."""
    payloads = [
        stamp_stream_offset(
            encode_message(
                b"",
                durable=False,
                application_properties=mapping or None,
                message_annotations={Symbol("x-exchange"): "", Symbol("x-routing-key"): "s"},
            ),
            100 + position,
        )[0]
        for position, mapping in enumerate(properties)
    ]
    rows = _rows(payloads, stream=True)
    assert [row["offset"] for row in rows] == [100 + i for i in range(len(properties))]
    for row, mapping in zip(rows, properties, strict=True):
        expected = {key: str(value) for key, value in mapping.items()} or None
        found = row["application_properties"]
        assert (dict(found) if found is not None else None) == expected
        assert dict(row["message_annotations"]) == {"x-exchange": "", "x-routing-key": "s"}


@given(st.data())
def test_each_rows_typed_properties_are_its_own_encoding(data: st.DataObject) -> None:
    """Rows of one layout of string values (encoded column-wise) alone or among rows of other
    layouts, other types and no properties: every row holds what encode_object makes of it."""
    keys = data.draw(st.lists(st.text(max_size=6), min_size=1, max_size=4, unique=True))
    alike: st.SearchStrategy[dict[str, object] | None] = st.lists(
        st.text(max_size=70), min_size=len(keys), max_size=len(keys)
    ).map(lambda values: dict(zip(keys, values, strict=True)))
    other: st.SearchStrategy[dict[str, object] | None] = st.none() | st.dictionaries(
        st.text(max_size=6), st.text(max_size=8) | st.integers(-5, 5), max_size=4
    )
    rows = alike if data.draw(st.booleans()) else alike | other
    properties = data.draw(st.lists(rows, min_size=1, max_size=12))
    payloads = [
        encode_message(b"", durable=False, application_properties=mapping or None)
        for mapping in properties
    ]
    for row, payload in zip(_rows(payloads, stream=False), payloads, strict=True):
        mapping = read_fields(payload).application_properties
        typed = row["application_properties_typed"]
        if mapping:
            assert (typed["value"], typed["metadata"]) == encode_object(mapping)
        else:
            assert typed is None


@given(st.lists(st.integers(-1, 3), min_size=1, max_size=30))
def test_rows_sharing_annotations_and_rows_with_their_own_each_show_theirs(
    choices: list[int],
) -> None:
    """A map column built once per distinct annotations object (mostly shared, as a stream's
    are) or row by row (mostly distinct): each row shows its own message's annotations."""
    shared: list[dict[Symbol, object]] = [
        {},
        {Symbol("x-exchange"): "", Symbol("x-routing-key"): "s"},
        {Symbol("x-opt-a"): 1, Symbol("x-opt-b"): b"\x01"},
        {Symbol("x-opt-a"): 2},
    ]
    annotations: list[dict[Symbol, object]] = [
        {Symbol("x-opt-row"): position} if choice < 0 else shared[choice]
        for position, choice in enumerate(choices)
    ]
    payloads = [
        stamp_stream_offset(encode_message(b"", durable=False, message_annotations=mapping), i)[0]
        for i, mapping in enumerate(annotations)
    ]
    for row, mapping in zip(_rows(payloads, stream=True), annotations, strict=True):
        found = row["message_annotations"]
        expected = {
            str(key): value.hex() if isinstance(value, bytes) else str(value)
            for key, value in mapping.items()
        }
        assert (dict(found) if found is not None else {}) == expected


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "body": st.binary(max_size=300),
                "message_id": st.none() | st.text(max_size=4) | st.integers(0, 9),
                "subject": st.none() | st.text(max_size=4),
                "application_properties": st.none()
                | st.dictionaries(st.sampled_from(["a", "b"]), st.text(max_size=3) | st.booleans()),
            }
        ),
        min_size=1,
        max_size=10,
    ),
    st.lists(st.sampled_from(COLUMNS), min_size=1, unique=True),
    st.booleans(),
)
def test_a_read_of_some_columns_holds_what_a_read_of_all_holds(
    messages: list[dict[str, Any]], columns: list[str], stream: bool
) -> None:
    """Whichever columns a read asks for, in any order (the others are skipped unread), its
    rows hold what a read of all of them does; batches are cut every BATCH_ROWS rows."""
    payloads = [
        stamp_stream_offset(
            encode_message(durable=True, message_annotations=_ROUTED, **message), 40 + position
        )[0]
        for position, message in enumerate(messages)
    ]
    with patch.object(records, "BATCH_ROWS", 3):
        full = _rows(payloads, stream=stream)
        builder = BatchBuilder(tuple(columns), stream=stream)
        if stream:
            builder.add_stream(payloads[:4])
            builder.add_stream(payloads[4:])
        else:
            builder.add_numbered(payloads[:4], 0)
            builder.add_numbered(payloads[4:], 4)
        batches = builder.finish()
    assert [batch.num_rows for batch in batches[:-1]] == [3] * (len(batches) - 1)
    assert [row for batch in batches for row in batch.to_pylist()] == [
        {name: row[name] for name in columns} for row in full
    ]
