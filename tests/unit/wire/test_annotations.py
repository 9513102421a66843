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
    routing_annotations,
    stamp_stream_offset,
)
from sluicegate.wire.errors import DecodeError


def with_routing_annotations(payload: bytes, exchange: str, routing_key: str) -> bytes:
    """``payload`` with RabbitMQ's routing annotations where :func:`annotations_offset` puts
    them: the splice gateway/rules/routing.py makes at the envelope's ``annotations_at``."""
    offset = annotations_offset(payload)
    if offset is None:
        return payload
    return payload[:offset] + routing_annotations(exchange, routing_key) + payload[offset:]


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


def _stamped(payload: bytes, offset: int) -> tuple[Message, str | None]:
    stamped, filter_value = stamp_stream_offset(payload, offset)
    decoded = Message()
    decoded.decode(stamped)
    return decoded, filter_value


@given(
    annotations=st.dictionaries(
        st.sampled_from(["x-a", "x-stream-offset", "x-stream-filter-value", "x-b" * 100]),
        st.text(max_size=20),
        max_size=3,
    ),
    offsets=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=3),
)
def test_every_stamp_carries_its_own_offset_and_the_publishers_annotations(
    annotations: dict[str, str], offsets: list[int]
) -> None:
    # The same section stamped again (as a stream's publisher sends it) takes each offset.
    payload = Message(body=b"body", annotations={symbol(k): v for k, v in annotations.items()})
    encoded = payload.encode()
    for offset in offsets:
        decoded, filter_value = _stamped(encoded, offset)
        expected = {k: v for k, v in annotations.items() if k != "x-stream-offset"}
        assert decoded.annotations == {**expected, "x-stream-offset": offset}
        # An empty value is none: RabbitMQ's streams file it with the unfiltered messages.
        assert filter_value == (annotations.get("x-stream-filter-value") or None)
        assert decoded.body == b"body"


def test_a_message_without_annotations_is_stamped_with_the_offset_alone() -> None:
    for offset in (0, 7, 2**40):
        decoded, filter_value = _stamped(Message(body="x", durable=True).encode(), offset)
        assert decoded.annotations == {"x-stream-offset": offset}
        assert decoded.durable
        assert filter_value is None


def test_annotations_that_are_no_map_are_refused_each_time() -> None:
    payload = b"\x00\x53\x72\xa1\x01x\x00\x53\x77\xa1\x01x"
    for _ in range(2):
        with pytest.raises(DecodeError):
            stamp_stream_offset(payload, 1)
