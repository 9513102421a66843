"""Message sections: finding them in proton-encoded messages, reading and rewriting the header."""

from __future__ import annotations

import contextlib
from typing import Any

import proton
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.message import Message
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import (
    APPLICATION_PROPERTIES,
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    Header,
    encode_header,
    read_header,
    section_code,
    sections,
    with_delivery_count,
)

# proton's annotations type an Array's descriptor as data, but UNDESCRIBED is its own sentinel.
_UNDESCRIBED: Any = proton.UNDESCRIBED


def _int_array(*items: int) -> proton.Array:
    return proton.Array(_UNDESCRIBED, proton.Data.INT, *items)


def _full_message() -> proton.Message:
    return proton.Message(
        body="the body",
        durable=True,
        priority=9,
        ttl=2.5,
        first_acquirer=True,
        delivery_count=3,
        id="id-1",
        user_id=b"guest",
        address="/queue/q",
        subject="subj",
        reply_to="/queue/r",
        correlation_id=42,
        content_type="text/plain",
        properties={"colour": "red", "n": 7, "flag": True, "arr": _int_array(1, 2, 3)},
        annotations={proton.symbol("x-opt-key"): "v"},
        instructions={proton.symbol("x-instr"): 1},
    )


def _decode_with_proton(payload: bytes) -> proton.Message:
    message = proton.Message()
    message.decode(payload)
    return message


def test_sections_of_a_proton_message() -> None:
    payload = _full_message().encode()
    found = sections(payload)
    codes = [code for code, _, _, _ in found]
    assert codes == [HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES,
                     APPLICATION_PROPERTIES]  # fmt: skip
    by_code = {code: value for code, value, _, _ in found}
    assert by_code[HEADER] == [True, 9, 2500, True, 3]
    properties = by_code[PROPERTIES]
    assert isinstance(properties, list)
    assert properties[:7] == ["id-1", b"guest", "/queue/q", "subj", "/queue/r", 42, "text/plain"]
    assert isinstance(properties[6], Symbol)  # content-type is a symbol
    assert by_code[APPLICATION_PROPERTIES] == {
        "colour": "red",
        "n": 7,
        "flag": True,
        "arr": [1, 2, 3],
    }
    assert by_code[MESSAGE_ANNOTATIONS] == {"x-opt-key": "v"}
    assert by_code[DELIVERY_ANNOTATIONS] == {"x-instr": 1}
    # The sections tile the message up to the body, which is never decoded.
    pos = 0
    for _, _, start, end in found:
        assert start == pos
        pos = end
    body = payload[pos:]
    assert body[:3] == b"\x00\x53\x77"


def test_sections_stop_before_the_body_even_when_it_is_garbage() -> None:
    payload = proton.Message(body=None, subject="s").encode() + b"\x00\x53\x75\xb0\xff\xff"
    codes = [code for code, _, _, _ in sections(payload)]
    assert codes == [HEADER, PROPERTIES]


def test_sections_until_properties() -> None:
    payload = _full_message().encode()
    codes = [code for code, _, _, _ in sections(payload, until=PROPERTIES)]
    assert codes == [HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS]


def test_sections_with_symbolic_descriptors() -> None:
    header = encode(Described(Symbol("amqp:header:list"), [True]))
    props = encode(Described(Symbol("amqp:application-properties:map"), {"a": 1}))
    body = encode(Described(Symbol("amqp:data:binary"), b"x"))
    found = sections(header + props + body)
    assert [(code, value) for code, value, _, _ in found] == [
        (HEADER, [True]),
        (APPLICATION_PROPERTIES, {"a": 1}),
    ]
    assert read_header(header + body).durable is True


@pytest.mark.parametrize(
    ("descriptor", "code"),
    [
        (0x70, HEADER),
        (0x77, 0x77),
        (Symbol("amqp:properties:list"), PROPERTIES),
        (Symbol("amqp:footer:map"), 0x78),
        (Symbol("unknown"), -1),
        ("amqp:header:list", -1),  # a string is not a symbol
        (True, -1),
        (None, -1),
    ],
)
def test_section_code(descriptor: Value, code: int) -> None:
    assert section_code(descriptor) == code


@pytest.mark.parametrize(
    "payload",
    [
        b"\x53\x70",  # a section that is not a described value
        b"\x00\x53\x70",  # a descriptor without its value
        b"\x00\x53\x70\xc0\x05\x01",  # a truncated header list
        b"\x00\x53\x70\x45\x00\x53",  # a truncated second section
    ],
)
def test_malformed_sections_raise_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        sections(payload)


@given(st.binary(max_size=300))
def test_sections_and_read_header_raise_only_decode_error(payload: bytes) -> None:
    for function in (sections, read_header):
        with contextlib.suppress(DecodeError):
            function(payload)


@given(st.data())
def test_truncated_proton_message_raises_only_decode_error(data: st.DataObject) -> None:
    payload = _full_message().encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    truncated = payload[:cut]
    for function in (sections, read_header, lambda p: with_delivery_count(p, 1)):
        with contextlib.suppress(DecodeError):
            function(truncated)


# -- the header ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x53\x77",  # not a described value at all: no header to read
        proton.Message(body="x", subject="s").encode(),  # proton's empty header list
        encode(Described(PROPERTIES, [None])) + encode(Described(0x77, "x")),  # no header
        b"\x00\x53\x70\x45",
        b"\x00\x53\x70\xc0\x06\x05\x40\x40\x40\x40\x40",  # every field null
    ],
)
def test_read_header_defaults(payload: bytes) -> None:
    assert read_header(payload) == Header(
        durable=False, priority=4, ttl=None, first_acquirer=False, delivery_count=0
    )


def test_read_header_of_a_proton_message() -> None:
    header = read_header(_full_message().encode())
    assert header == Header(
        durable=True, priority=9, ttl=2500, first_acquirer=True, delivery_count=3
    )


def test_read_header_that_is_not_a_list() -> None:
    with pytest.raises(DecodeError):
        read_header(b"\x00\x53\x70\xa1\x01x")


def test_encode_header_drops_trailing_defaults() -> None:
    assert encode_header(Header()) == b"\x00\x53\x70\x45"
    assert encode_header(Header(durable=True)) == b"\x00\x53\x70\xc0\x02\x01\x41"
    assert encode_header(Header(delivery_count=1)) == (
        b"\x00\x53\x70\xc0\x08\x05\x42\x50\x04\x40\x42\x52\x01"
    )


headers = st.builds(
    Header,
    durable=st.booleans(),
    priority=st.integers(min_value=0, max_value=255),
    ttl=st.none() | st.integers(min_value=0, max_value=2**32 - 1),
    first_acquirer=st.booleans(),
    delivery_count=st.integers(min_value=0, max_value=2**32 - 1),
)


@given(headers)
def test_encode_header_round_trips_through_us_and_proton(header: Header) -> None:
    raw = encode_header(header)
    assert read_header(raw) == header
    message = _decode_with_proton(raw)
    assert message.durable is header.durable
    assert message.priority == header.priority
    assert message.first_acquirer is header.first_acquirer
    assert message.delivery_count == header.delivery_count
    if header.ttl is not None:
        assert round(message.ttl * 1000) == header.ttl


def _header_end(payload: bytes) -> int:
    found = sections(payload)
    return found[0][3] if found and found[0][0] == HEADER else 0


def _proton_message_strategy() -> st.SearchStrategy[proton.Message]:
    def build(
        durable: bool,
        priority: int,
        ttl_ms: int,
        first_acquirer: bool,
        delivery_count: int,
        subject: str | None,
        props: dict[str, int],
        body: str | bytes | None,
    ) -> proton.Message:
        message = proton.Message(body=body, properties=dict(props) if props else None)
        message.durable = durable
        message.priority = priority
        if ttl_ms:
            message.ttl = ttl_ms / 1000
        message.first_acquirer = first_acquirer
        message.delivery_count = delivery_count
        if subject is not None:
            message.subject = subject
        return message

    return st.builds(
        build,
        st.booleans(),
        st.integers(min_value=0, max_value=255),
        st.integers(min_value=0, max_value=10_000_000),
        st.booleans(),
        st.integers(min_value=0, max_value=2**32 - 1),
        st.none() | st.text(max_size=10),
        st.dictionaries(st.text(max_size=5), st.integers(-100, 100), max_size=3),
        st.none() | st.text(max_size=50) | st.binary(max_size=50),
    )


@given(_proton_message_strategy(), st.integers(min_value=0, max_value=2**32 - 1))
def test_with_delivery_count_rewrites_only_the_header(
    original: proton.Message, delivery_count: int
) -> None:
    payload = original.encode()
    result = with_delivery_count(payload, delivery_count)
    # Every section after the header is byte-identical.
    assert result[_header_end(result) :] == payload[_header_end(payload) :]
    # Our reader and proton agree on the new header; the other fields are untouched.
    before = read_header(payload)
    assert read_header(result) == Header(
        durable=before.durable,
        priority=before.priority,
        ttl=before.ttl,
        first_acquirer=before.first_acquirer,
        delivery_count=delivery_count,
    )
    decoded = _decode_with_proton(result)
    assert decoded.delivery_count == delivery_count
    assert decoded.durable is original.durable
    assert decoded.priority == original.priority
    assert decoded.ttl == original.ttl
    assert decoded.first_acquirer is original.first_acquirer
    assert decoded.subject == original.subject
    assert decoded.properties == original.properties
    assert decoded.body == original.body


def test_with_delivery_count_inserts_a_missing_header() -> None:
    message = proton.Message(body="b", subject="s")
    payload = message.encode()
    without_header = payload[_header_end(payload) :]
    assert not without_header.startswith(b"\x00\x53\x70")
    result = with_delivery_count(without_header, 5)
    assert result.endswith(without_header)
    assert read_header(result).delivery_count == 5
    decoded = _decode_with_proton(result)
    assert decoded.delivery_count == 5
    assert decoded.subject == "s"
    assert decoded.body == "b"


def test_with_delivery_count_on_an_empty_payload() -> None:
    result = with_delivery_count(b"", 2)
    assert read_header(result) == Header(delivery_count=2)
    assert _decode_with_proton(result).delivery_count == 2


def test_with_delivery_count_keeps_a_symbolic_header_fields() -> None:
    payload = encode(Described(Symbol("amqp:header:list"), [True, 7])) + encode(
        Described(0x77, "v")
    )
    result = with_delivery_count(payload, 1)
    assert read_header(result) == Header(durable=True, priority=7, delivery_count=1)
    assert result.endswith(encode(Described(0x77, "v")))


def test_message_count_failed_delivery_updates_count_and_the_bytes_read() -> None:
    published = proton.Message(body="x", delivery_count=1).encode()
    message = Message(published, delivery_count=1)
    message.count_failed_delivery()
    assert message.delivery_count == 2
    # The payload stays as published (shared by a fan-out's copies); the wire bytes carry 2.
    assert message.payload == published
    assert read_header(message.read()).delivery_count == 2
    assert _decode_with_proton(message.send()).body == "x"
    assert message.read_size() == len(message.read())


@pytest.mark.parametrize(
    "header_fields",
    [
        [False, 1000],  # priority must be a ubyte
        [False, 4, -1],  # ttl must be a uint
        [False, True],  # priority must be a number, not a boolean
        ["yes"],  # durable must be a boolean
        [False, 4, None, False, 1 << 32],  # delivery-count must fit a uint
    ],
)
def test_with_delivery_count_on_an_ill_typed_header_raises_decode_error(
    header_fields: list[Value],
) -> None:
    payload = encode(Described(HEADER, header_fields)) + encode(Described(0x77, "x"))
    with pytest.raises(DecodeError):
        with_delivery_count(payload, 1)
