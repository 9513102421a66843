"""The headers exchange's rules (RabbitMQ 4's rabbit_exchange_type_headers) and header reading."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.headers import NULL, comparable, headers_match, routing_headers
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import DecodeError

# Values a header or a binding argument can hold: the simple types and a compound one.
simple_values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
)
names = st.sampled_from(["a", "b", "c", "x-a", "x-b"])


def _message(
    properties: dict[str, object] | None = None,
    annotations: dict[Symbol, object] | None = None,
    body: bytes = b"\x00\x53\x77\xa1\x04body",
) -> bytes:
    parts = [b"\x00\x53\x70\x45"]
    if annotations is not None:
        parts.append(encode(Described(0x72, dict(annotations))))  # type: ignore[arg-type]
    parts.append(encode(Described(0x73, [None, None, None, "subject"])))
    if properties is not None:
        parts.append(encode(Described(0x74, dict(properties))))  # type: ignore[arg-type]
    return b"".join(parts) + body


def _matches(arguments: dict[str, object], properties: dict[str, object]) -> bool:
    return headers_match(arguments).matches(routing_headers(_message(properties)))


@pytest.mark.parametrize(
    ("arguments", "properties", "expected"),
    [
        # all (the default): every argument must match.
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
        ({"a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1}, {"a": 2}, False),
        # any: one will do.
        ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
        ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
        # Types count: an integer is not a float, a boolean, or a string.
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": "1"}, False),
        # A string equals a binary of the same bytes (both Erlang binaries in RabbitMQ).
        ({"a": "abc"}, {"a": b"abc"}, True),
        # A null argument asks for presence only, whatever the value, null included.
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"b": 1}, False),
        # A null header is present but equals no value.
        ({"a": 1}, {"a": None}, False),
        # x- arguments are ignored unless the match is -with-x.
        ({"x-a": 1}, {}, True),
        ({"x-match": "any", "x-a": 1}, {"x-a": 1}, False),
        ({"x-match": "all-with-x", "x-a": 1}, {"x-a": 1}, True),
        ({"x-match": "all-with-x", "x-a": 1}, {}, False),
        ({"x-match": "any-with-x", "x-a": 1, "b": 2}, {"x-a": 1}, True),
        # Nothing to match: all matches everything, any nothing.
        ({}, {}, True),
        ({"x-match": "any"}, {"a": 1}, False),
        # A compound argument matches nothing, and compound headers are not present.
        ({"a": [1]}, {"a": [1]}, False),
        ({"a": None}, {"a": [1]}, False),
        ({"x-match": "any", "a": [1], "b": 2}, {"b": 2}, True),
    ],
)
def test_rules(arguments: dict[str, object], properties: dict[str, object], expected: bool) -> None:
    assert _matches(arguments, properties) is expected


@pytest.mark.parametrize("kind", ["none", "ALL", ""])
def test_an_unknown_x_match_is_refused(kind: str) -> None:
    with pytest.raises(PreconditionFailed, match="Invalid x-match field value"):
        headers_match({"x-match": kind})


def test_an_x_match_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(PreconditionFailed, match="Invalid x-match field type"):
        headers_match({"x-match": 1})


@given(
    st.dictionaries(names, st.one_of(st.none(), simple_values), max_size=5),
    st.dictionaries(names, simple_values, max_size=5),
    st.sampled_from(["all", "any", "all-with-x", "any-with-x"]),
)
def test_matching_is_the_specified_quantifier(
    arguments: dict[str, object], headers: dict[str, object], kind: str
) -> None:
    """all/any over the counted arguments, each present with an equal value (or null)."""
    counted = {
        name: value
        for name, value in arguments.items()
        if kind.endswith("-with-x") or not name.startswith("x-")
    }

    def satisfied(name: str, value: object) -> bool:
        if name not in headers:
            return False
        return value is None or comparable(value) == comparable(headers[name])

    results = [satisfied(name, value) for name, value in counted.items()]
    expected = any(results) if kind.startswith("any") else all(results)
    assert _matches({**arguments, "x-match": kind}, headers) is expected


@given(st.dictionaries(st.text(max_size=8), simple_values, max_size=8))
def test_application_properties_are_read_as_compared(properties: dict[str, object]) -> None:
    read = routing_headers(_message(properties))
    assert read == {name: comparable(value) for name, value in properties.items()}


def test_message_annotations_count_and_win_over_application_properties() -> None:
    payload = _message({"a": 1, "x-b": "props"}, {Symbol("x-b"): "annotation", Symbol("c"): 3})
    assert routing_headers(payload) == {
        "a": comparable(1),
        "x-b": comparable("annotation"),
        "c": comparable(3),
    }


def test_keys_of_the_wrong_kind_and_values_that_are_not_simple_are_left_out() -> None:
    # Application-properties keys are strings, annotation keys symbols (RabbitMQ's reading).
    payload = _message(
        {Symbol("sym"): 1, "list": [1, 2], "map": {"k": 1}, "null": None, "ok": 2},
        {"plain-string-key": 1},  # type: ignore[dict-item]
    )
    assert routing_headers(payload) == {"null": NULL, "ok": comparable(2)}


def test_a_value_that_is_not_simple_is_left_out() -> None:
    # {"dec": decimal32 (0x74, 4 bytes), "ok": 1}: RabbitMQ routes on simple values only.
    entries = b"\xa1\x03dec\x74\x01\x02\x03\x04" + b"\xa1\x02ok\x53\x01"
    section = b"\x00\x53\x74\xc1" + bytes((len(entries) + 1, 4)) + entries
    payload = b"\x00\x53\x70\x45" + section + b"\x00\x53\x77\xa1\x01x"
    assert routing_headers(payload) == {"ok": comparable(1)}


def test_the_body_is_never_read() -> None:
    # A body that is not even valid AMQP: reading stops at application-properties.
    payload = _message({"a": 1}, body=b"\x00\x53\x75\xff\xff")
    assert routing_headers(payload) == {"a": comparable(1)}
    assert routing_headers(_message(None, body=b"\x00\x53\x75\xff\xff")) == {}


@pytest.mark.parametrize(
    "section",
    [
        b"\x00\x53\x74\xc0\x01\x00",  # a list, not a map
        b"\x00\x53\x74\xc1\x05\x03\xa1\x01a\x53",  # an odd count, cut short
        b"\x00\x53\x74\xc1\x00",  # a size too small for its count
    ],
)
def test_malformed_application_properties_are_a_decode_error(section: bytes) -> None:
    with pytest.raises(DecodeError):
        routing_headers(b"\x00\x53\x70\x45" + section)
