"""A delivered message's fields in one pass, checked against proton's own encoder and decoder."""

from __future__ import annotations

import contextlib
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Message, byte, char, decimal128, float32, int32, short, symbol, timestamp, ulong

from sluicegate.spark.message_encoding import encode_message
from sluicegate.spark.message_fields import read_fields
from sluicegate.wire.amqp_types import Byte, Float32, Int, Short, Symbol, Timestamp
from sluicegate.wire.annotations import stamp_stream_offset
from sluicegate.wire.errors import DecodeError

_LONGS = st.integers(-(2**63), 2**63 - 1)
# AMQP strings are UTF-8: a lone surrogate has no encoding, proton refuses it.
_CHARACTERS = st.characters(exclude_categories=["Cs"])
# Application property values a publisher sends, as proton types them, with the value this
# reader gives back (and its type).
_PROPERTIES = st.one_of(
    st.text(_CHARACTERS, max_size=300).map(lambda s: (s, s)),
    _LONGS.map(lambda n: (n, n)),
    st.booleans().map(lambda b: (b, b)),
    st.floats(allow_nan=False).map(lambda f: (f, f)),
    st.integers(-128, 127).map(lambda n: (byte(n), Byte(n))),
    st.integers(-(2**15), 2**15 - 1).map(lambda n: (short(n), Short(n))),
    st.integers(-(2**31), 2**31 - 1).map(lambda n: (int32(n), Int(n))),
    st.integers(0, 2**64 - 1).map(lambda n: (ulong(n), n)),
    st.integers(0, 2**62).map(lambda n: (timestamp(n), Timestamp(n))),
    st.binary(max_size=300).map(lambda b: (b, b)),
    st.uuids().map(lambda u: (u, u)),
    st.text(st.characters(max_codepoint=127), min_size=1, max_size=20).map(
        lambda s: (symbol(s), Symbol(s))
    ),
    _CHARACTERS.map(lambda c: (char(c), c)),
    st.none().map(lambda n: (n, n)),
)


@given(
    st.dictionaries(st.text(_CHARACTERS, max_size=40), _PROPERTIES, max_size=12),
    st.binary(max_size=2000),
    # proton sets a subject as a C string: it would end at a NUL.
    st.one_of(
        st.none(),
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=80),
    ),
    st.integers(0, 2**31),
    st.booleans(),
)
def test_what_proton_encodes_reads_back_with_its_types(
    properties: dict[str, tuple[Any, Any]],
    body: bytes,
    subject: str | None,
    delivery_count: int,
    durable: bool,
) -> None:
    message = Message(
        body=body,
        id="order-1",
        subject=subject,
        durable=durable,
        content_type="application/json",
        properties={key: sent for key, (sent, _) in properties.items()},
        annotations={symbol("x-stream-offset"): 42, symbol("x-opt-tag"): "t"},
    )
    message.inferred = True
    message.delivery_count = delivery_count
    message.creation_time = 1_700_000_000.123
    fields = read_fields(message.encode())
    assert fields.body == body
    assert fields.body_section == "data"
    assert (fields.delivery_count, fields.durable) == (delivery_count, durable)
    assert (fields.message_id, fields.subject, fields.content_type) == (
        "order-1",
        subject,
        "application/json",
    )
    assert fields.creation_time == 1_700_000_000_123
    assert fields.message_annotations == {"x-stream-offset": 42, "x-opt-tag": "t"}
    got = fields.application_properties or {}
    assert got == {key: read for key, (_, read) in properties.items()}
    for key, (_, read) in properties.items():
        assert type(got[key]) is type(read), key


def test_floats_decimals_and_an_amqp_value_body() -> None:
    message = Message(
        body={"a": [1, "b"]},
        # 12 x 10^0: biased exponent 6176 (0x3040 in the top bits), coefficient 12.
        properties={"f": float32(1.5), "d": decimal128(bytes.fromhex("3040" + "00" * 13 + "0c"))},
    )
    fields = read_fields(message.encode())
    assert fields.body_section == "amqp-value"
    assert fields.body == {"a": [1, "b"]}
    properties = fields.application_properties
    assert properties is not None
    assert properties["f"] == 1.5
    assert type(properties["f"]) is Float32
    assert properties["d"] == Decimal(12)


@given(
    st.dictionaries(st.text(_CHARACTERS, max_size=40), _PROPERTIES, max_size=12),
    st.binary(max_size=2000),
    st.booleans(),
)
def test_what_this_module_encodes_proton_reads_with_the_same_values(
    properties: dict[str, tuple[Any, Any]], body: bytes, durable: bool
) -> None:
    typed = {key: read for key, (_, read) in properties.items()}
    encoded = encode_message(
        body,
        durable=durable,
        message_id="q:0:1:7",
        correlation_id=uuid.UUID(int=9),
        subject="s",
        content_type="text/plain",
        creation_time=Timestamp(1_700_000_000_123),
        application_properties=typed,
        message_annotations={Symbol("x-opt-a"): "v"},
    )
    message = Message()
    message.decode(encoded)
    received: Any = message.body  # proton types it as any body; a data section is bytes
    assert bytes(received) == body
    assert message.durable is durable
    assert (message.id, message.correlation_id) == ("q:0:1:7", uuid.UUID(int=9))
    assert message.subject == "s"
    assert message.content_type == "text/plain"
    assert message.creation_time == pytest.approx(1_700_000_000.123)
    assert dict(message.annotations or {}) == {"x-opt-a": "v"}
    delivered: Any = message.properties  # proton declares the attribute as None
    sent: dict[str, Any] = dict(delivered or {})
    decoded = {
        key: bytes(value) if isinstance(value, memoryview) else value for key, value in sent.items()
    }
    assert decoded == typed
    assert read_fields(encoded).application_properties == (typed or None)


def test_a_decimal_goes_out_as_decimal128_and_comes_back_equal() -> None:
    for text in ("0", "-12.345", "1E+10", "0.000001", "9" * 34):
        encoded = encode_message(b"", durable=False, application_properties={"d": Decimal(text)})
        properties = read_fields(encoded).application_properties
        assert properties == {"d": Decimal(text)}


@given(st.data())
def test_a_truncated_or_damaged_message_is_a_decode_error_or_reads(data: st.DataObject) -> None:
    """Never an IndexError or a struct error: every malformed input is a DecodeError."""
    message = Message(body=b"x" * 40, id="i", properties={"a": 1, "b": "two"})
    message.inferred = True
    encoded = bytearray(message.encode())
    cut = data.draw(st.integers(0, len(encoded)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(encoded) - 1), st.integers(0, 255))))
    for position, value in flips:
        encoded[position] = value
    with contextlib.suppress(DecodeError):
        read_fields(bytes(encoded[:cut]))


@given(
    st.dictionaries(
        st.text(st.characters(max_codepoint=127), min_size=1, max_size=20),
        st.one_of(st.text(max_size=30), _LONGS, st.booleans(), st.lists(st.integers(0, 9))),
        max_size=4,
    ),
    st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=5),
)
def test_a_streams_annotations_read_the_same_from_the_cache_of_their_prefixes(
    annotations: dict[str, Any], offsets: list[int]
) -> None:
    """A stream stamps x-stream-offset last; what comes before it is decoded once and reused."""
    message = Message(body=b"b", annotations={symbol(k): v for k, v in annotations.items()})
    for offset in offsets:
        stamped = stamp_stream_offset(message.encode(), offset)[0]
        for _ in range(2):  # the second read finds the prefix in the cache
            found = read_fields(stamped).message_annotations
            assert found == {**annotations, "x-stream-offset": offset}
            assert found is not None
            assert list(found)[-1] == "x-stream-offset"
            assert all(type(key) is Symbol for key in found)


def test_annotations_naming_the_offset_twice_are_never_cached_as_a_prefix() -> None:
    """x-stream-offset, x-opt-a, then x-stream-offset again: the dict keeps the first place."""
    offset_key = b"\xa3\x0fx-stream-offset"
    for offset in (5, 7):
        entries = (
            offset_key
            + b"\x81"
            + (1).to_bytes(8, "big")
            + b"\xa3\x07x-opt-a\xa1\x01x"
            + offset_key
            + b"\x81"
            + offset.to_bytes(8, "big")
        )
        section = b"\x00Sr\xc1" + bytes((len(entries) + 1, 6)) + entries
        found = read_fields(section + b"\x00Su\xa0\x01b").message_annotations
        assert found == {"x-stream-offset": offset, "x-opt-a": "x"}


def test_a_data_section_after_an_amqp_value_body_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="a data section after an amqp-sequence body"):
        read_fields(b"\x00Sv\xc0\x03\x01\xa1\x00\x00Su\xa0\x00")
