"""The envelope read at publish: the codec's answers, fast, and only DecodeError on garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Message as ProtonMessage
from proton import decimal32, decimal64, decimal128

from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.annotations import annotations_offset
from sluicegate.wire.decoding import MAX_DEPTH
from sluicegate.wire.encoding import encode
from sluicegate.wire.envelope import read_envelope
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import read_header

_SAMPLES = [
    ProtonMessage(body="x"),
    ProtonMessage(body=b"x" * 300, durable=True, ttl=1.5, priority=7, id="id-1"),
    ProtonMessage(body="x", address="/queues/q", subject="a.b", expiry_time=1234.5),
    ProtonMessage(
        body="x",
        annotations={"x-opt-a": 1},
        instructions={"x-opt-d": "v"},
        properties={"region": "eu"},
        delivery_count=3,
        first_acquirer=True,
    ),
    ProtonMessage(body="x", subject="s" * 300, address="t" * 300),
]


def test_envelopes_of_real_messages() -> None:
    for sample in _SAMPLES:
        payload = bytes(sample.encode())
        envelope = read_envelope(payload)
        assert envelope.header == read_header(payload)
        assert envelope.to == sample.address
        assert envelope.subject == sample.subject
        expected_expiry = None if not sample.expiry_time else round(sample.expiry_time * 1000)
        assert envelope.absolute_expiry_time == expected_expiry
        assert envelope.annotations_at == annotations_offset(payload)


@given(st.binary(max_size=64))
def test_garbage_raises_only_decode_error(data: bytes) -> None:
    try:
        envelope = read_envelope(data)
    except DecodeError:
        return
    assert envelope.annotations_at is None or 0 <= envelope.annotations_at <= len(data)


@given(st.sampled_from(_SAMPLES), st.integers(min_value=0, max_value=80), st.binary(max_size=4))
def test_corrupted_messages_raise_only_decode_error(
    sample: ProtonMessage, at: int, noise: bytes
) -> None:
    payload = bytearray(sample.encode())
    at = min(at, len(payload))
    corrupted = bytes(payload[:at] + noise + payload[at + len(noise) :])
    try:
        envelope = read_envelope(corrupted)
    except DecodeError:
        return
    at_most = len(corrupted)
    assert envelope.annotations_at is None or 0 <= envelope.annotations_at <= at_most


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "message",
    [
        ProtonMessage(body="x", properties={"deep": _nested(70)}),
        ProtonMessage(body="x", annotations={"x-opt-deep": _nested(70)}),
        ProtonMessage(body="x", instructions={"x-opt-deep": _nested(70)}),
    ],
    ids=["application-properties", "message-annotations", "delivery-annotations"],
)
def test_sections_the_pipeline_decodes_must_decode_at_the_door(message: ProtonMessage) -> None:
    """Dead-lettering, filters and headers exchanges decode these sections later: what they
    could not read is refused at publish, not lost after it was accepted."""
    with pytest.raises(DecodeError):
        read_envelope(bytes(message.encode()))


def test_decimals_are_accepted_at_the_door() -> None:
    """Valid AMQP the server does not interpret (decimal32/64/128) is carried, not refused."""
    message = ProtonMessage(
        body="x",
        properties={"price": decimal32(7), "total": decimal64(8), "sum": decimal128(b"\x01" * 16)},
        annotations={"x-opt-price": decimal32(9)},
    )
    read_envelope(bytes(message.encode()))


def test_nesting_within_the_codec_limit_is_accepted() -> None:
    # The section map is one level, its value the other MAX_DEPTH - 1.
    read_envelope(bytes(ProtonMessage(body="x", properties={"d": _nested(MAX_DEPTH - 1)}).encode()))


def test_a_message_annotations_section_that_is_not_a_map_is_refused() -> None:
    payload = encode(Described(0x72, [1, 2])) + encode(Described(0x77, "x"))
    with pytest.raises(DecodeError, match="message-annotations section is not a map"):
        read_envelope(payload)


def test_application_properties_over_the_limit_are_measured_not_decoded() -> None:
    """A map past the limit is refused by its size; decoding it first would cost the reactor."""
    entries: dict[Value, Value] = {f"k{i}": i for i in range(1000)}
    payload = b"\x00\x53\x74" + encode(entries) + encode(Described(0x77, "x"))
    size = len(encode(entries))
    assert read_envelope(payload, size).application_properties_size == size
    # A map whose entries would not decode, but whose width is sound, is not read past the limit:
    # the first value (after the section's 3 bytes, the map's 9 and the key "k0") is garbage.
    broken = bytearray(payload)
    broken[3 + 9 + 4] = 0x0F
    assert read_envelope(bytes(broken), size - 1).application_properties_size == size
    with pytest.raises(DecodeError):
        read_envelope(bytes(broken), size)


def test_message_annotations_over_the_limit_are_measured_not_decoded() -> None:
    """As application-properties: a map past the limit is refused by its size, unread."""
    entries: dict[Value, Value] = {Symbol(f"x-{i}"): [i] for i in range(1000)}
    payload = b"\x00\x53\x72" + encode(entries) + encode(Described(0x77, "x"))
    size = len(encode(entries))
    assert read_envelope(payload, None, size).message_annotations_size == size
    broken = bytearray(payload)
    # The first value (after the section's 3 bytes, the map's 9 and the key "x-0"'s 5).
    broken[3 + 9 + 5] = 0x0F
    assert read_envelope(bytes(broken), None, size - 1).message_annotations_size == size
    with pytest.raises(DecodeError):
        read_envelope(bytes(broken), None, size)


@given(st.lists(st.sampled_from(["a", "b", "c.d", ""]), max_size=10))
def test_x_cc_keys_are_read_once_each_in_order(keys: list[str]) -> None:
    """A key named twice routes once; scalar annotations beside x-cc do not hide it."""
    entries: dict[Value, Value] = {Symbol("x-a"): 1, Symbol("x-cc"): list(keys)}
    payload = b"\x00\x53\x72" + encode(entries) + encode(Described(0x77, "x"))
    assert read_envelope(payload).cc == tuple(dict.fromkeys(keys))


def test_a_header_read_once_serves_every_message_that_sends_it() -> None:
    first = bytes(ProtonMessage(body="a", durable=True, priority=7).encode())
    second = bytes(ProtonMessage(body="b", durable=True, priority=7, subject="s").encode())
    assert read_envelope(first).header is read_envelope(second).header
    assert read_envelope(first).header == read_header(first)


def test_a_malformed_header_is_refused_every_time() -> None:
    # A header whose durable field is a string: refused, and never remembered as read.
    payload = b"\x00\x53\x70\xc0\x04\x01\xa1\x01x" + bytes(ProtonMessage(body="x").encode())[3:]
    for _ in range(2):
        with pytest.raises(DecodeError):
            read_envelope(payload)
