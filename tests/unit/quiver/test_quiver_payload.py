"""The pre-encoded message and where the receiver finds the stamp in raw transfers."""

from __future__ import annotations

import struct

import pytest
from proton import Message

from sluicegate.clients.quiver.payload import (
    PayloadError,
    body_headers,
    check_stamped,
    encode_template,
)


@pytest.mark.parametrize(("body_size", "durable"), [(8, False), (100, True), (300, False)])
def test_template_decodes_to_a_zero_body_with_the_stamp_at_its_start(
    body_size: int, durable: bool
) -> None:
    template = encode_template(body_size, durable)
    stamped = bytearray(template.encoded)
    struct.pack_into(">q", stamped, template.stamp_offset, 1_700_000_000_123_456_789)
    message = Message()
    message.decode(bytes(stamped))
    assert message.durable is durable
    decoded: object = message.body  # proton's hints omit memoryview, how it decodes a data section
    assert isinstance(decoded, memoryview)
    body = bytes(decoded)
    assert len(body) == body_size
    assert struct.unpack_from(">q", body)[0] == 1_700_000_000_123_456_789
    assert body[8:] == bytes(body_size - 8)
    assert template.stamp_offset == len(template.encoded) - body_size


@pytest.mark.parametrize("body_size", [100, 300])
def test_check_accepts_what_a_broker_may_add_in_front(body_size: int) -> None:
    template = encode_template(body_size, durable=False)
    annotated = Message(body=bytes(body_size), annotations={"x-opt-added": "by a broker"})
    annotated.inferred = True
    for raw in (template.encoded, annotated.encode()):
        check_stamped(raw, body_headers(body_size), body_size)


def test_check_accepts_a_body_sent_as_amqp_value() -> None:
    raw = Message(body=bytes(100)).encode()  # not inferred: amqp-value holding binary
    check_stamped(raw, body_headers(100), 100)


@pytest.mark.parametrize(
    "raw",
    [
        Message(body="a string of a hundred characters".ljust(100)).encode(),
        Message(body=bytes(99), inferred=True).encode(),
        b"",
        b"\x00Su\xa0\x64",
    ],
)
def test_check_refuses_other_traffic(raw: bytes) -> None:
    with pytest.raises(PayloadError, match="100-byte binary body"):
        check_stamped(raw, body_headers(100), 100)
