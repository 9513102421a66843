"""Message annotations spliced into encoded messages: proton reads them, the body is untouched."""

from __future__ import annotations

import proton
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Message, symbol

from sluicegate.wire.annotations import (
    InvalidAnnotations,
    annotations_offset,
    merge_annotations,
    modified_annotations,
    with_routing_annotations,
)
from sluicegate.wire.errors import DecodeError


def _roundtrip(message: Message) -> Message:
    payload = with_routing_annotations(message.encode(), "amq.direct", "orders")
    decoded = Message()
    decoded.decode(payload)
    return decoded


@given(
    body=st.binary(max_size=300),
    durable=st.booleans(),
    # proton's C layer cuts a subject at NUL, on both sides, and cannot encode a lone surrogate
    # as UTF-8 (AMQP strings are UTF-8): neither is what is tested here.
    subject=st.none()
    | st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20),
    delivery_annotations=st.booleans(),
    properties=st.dictionaries(
        st.text(st.characters(exclude_categories=["Cs"]), max_size=8),
        st.integers(-5, 5),
        max_size=3,
    ),
)
def test_annotations_are_added_where_amqp_puts_them(
    body: bytes,
    durable: bool,
    subject: str | None,
    delivery_annotations: bool,
    properties: dict[str, int],
) -> None:
    message = Message(body=body, durable=durable, subject=subject, properties=properties or None)
    if delivery_annotations:
        message.instructions = {symbol("x-opt-hop"): 1}
    decoded = _roundtrip(message)
    assert decoded.annotations == {"x-exchange": "amq.direct", "x-routing-key": "orders"}
    assert decoded.body == body
    assert decoded.durable == durable
    assert decoded.subject == subject
    application_properties: object = decoded.properties
    assert (application_properties or {}) == properties
    if delivery_annotations:
        assert decoded.instructions == {"x-opt-hop": 1}


def test_a_message_with_annotations_keeps_them_and_its_bytes() -> None:
    message = Message(body=b"x", annotations={symbol("x-opt-mine"): "kept"})
    payload = message.encode()
    assert with_routing_annotations(payload, "", "q") is payload
    assert annotations_offset(payload) is None


def test_a_message_without_sections_gets_only_the_annotations() -> None:
    decoded = Message()
    decoded.decode(with_routing_annotations(b"", "", "q"))
    assert decoded.annotations == {"x-exchange": "", "x-routing-key": "q"}


@pytest.mark.parametrize("payload", [b"\x01\x02", b"\x00\x53\x70\xc0\x05"])
def test_malformed_sections_are_a_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        with_routing_annotations(payload, "", "q")


def test_a_modified_outcomes_annotations_merge_keeping_values_and_body() -> None:
    original = Message(body=b"\x00body", annotations={symbol("x-keep"): proton.uint(7)})
    additions = proton.Data()
    additions.put_object({symbol("x-opt-note"): "added", symbol("x-keep"): proton.ulong(8)})
    merged = Message()
    merged.decode(merge_annotations(original.encode(), additions.encode()))
    assert merged.body == b"\x00body"
    assert merged.annotations == {symbol("x-keep"): 8, symbol("x-opt-note"): "added"}
    assert type(merged.annotations[symbol("x-keep")]) is proton.ulong
    # A message without the section gets one.
    bare = Message()
    bare.decode(merge_annotations(Message(body="b").encode(), additions.encode()))
    assert bare.annotations == {symbol("x-keep"): 8, symbol("x-opt-note"): "added"}


@pytest.mark.parametrize(
    "annotations",
    [{symbol("reason"): 1}, {"x-opt-a-string-key": 1}, {symbol("x-ok"): 1, symbol("y"): 2}],
)
def test_modified_annotations_must_have_x_symbol_keys(annotations: dict[object, object]) -> None:
    data = proton.Data()
    data.put_object(annotations)
    with pytest.raises(InvalidAnnotations):
        modified_annotations(data.encode())


def test_empty_modified_annotations_are_none() -> None:
    data = proton.Data()
    data.put_object({})
    assert modified_annotations(data.encode()) is None
    assert modified_annotations(None) is None
