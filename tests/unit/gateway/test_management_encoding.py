"""Management replies encoded without proton's Data: the types proton would give, any size."""

from __future__ import annotations

import uuid

import pytest
from proton import UNDESCRIBED, Array, Data, DataException, Message, symbol, timestamp, uint, ulong

from sluicegate.gateway.management.encoding import encode_reply_value
from sluicegate.gateway.management.node import encode_reply
from sluicegate.gateway.rules.management.requests import Response
from sluicegate.wire.amqp_types import UInt, ULong


def _decoded(encoded: bytes) -> object:
    data = Data()
    data.decode(encoded)
    return data.get_object()


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -5,
        300,
        -(2**40),
        1.5,
        "",
        "héllo",
        "x" * 300,
        symbol("x-queue-type"),
        [],
        [1, "a", None],
        {},
        {"arguments": {"x-max-length": 100}, "replicas": ["node"]},
        timestamp(1_700_000_000_000),
        uuid.UUID(int=5),
        ulong(7),
        uint(2**20),
    ],
)
def test_values_come_back_as_proton_would_have_encoded_them(value: object) -> None:
    expected = Data()
    expected.put_object(value)
    back = _decoded(encode_reply_value(value))
    assert back == value
    assert type(back) is type(_decoded(expected.encode()))


def test_rabbitmqs_counts_keep_their_types() -> None:
    back = _decoded(encode_reply_value({"message_count": ULong(3), "consumer_count": UInt(2**17)}))
    assert isinstance(back, dict)
    assert type(back["message_count"]) is ulong
    assert type(back["consumer_count"]) is uint
    array = Array(UNDESCRIBED, Data.INT, 1, 2)  # type: ignore[arg-type]
    back_array = _decoded(encode_reply_value(array))
    assert isinstance(back_array, Array)
    assert list(back_array.elements) == [1, 2]


def test_a_reply_far_beyond_what_proton_data_holds() -> None:
    """proton's Data indexes its nodes with 16 bits: 65,536 values were the end of it."""
    body = [
        {"name": f"q{n}", "message_count": ULong(n), "consumer_count": UInt(0)}
        for n in range(30_000)
    ]
    encoded = encode_reply(Response(200, body), "request-1")
    with pytest.raises(DataException, match="-10"):
        Data().put_object([{"name": item["name"], "message_count": 0} for item in body])
    message = Message()
    message.decode(encoded[: encoded.index(b"\x00\x53\x77")])
    assert (message.subject, message.correlation_id) == ("200", "request-1")
    assert encoded.index(b"\x00\x53\x77") + 3 + len(encode_reply_value(body)) == len(encoded)


def test_booleans_are_written_as_rabbitmq_writes_them() -> None:
    # RabbitMQ's {boolean, B} is 0x56 and a byte; rhea reads it as 1 or 0, and RabbitMQ's
    # JavaScript client compares a queue's durable, auto_delete and exclusive with 1.
    assert encode_reply_value(True) == b"\x56\x01"
    assert encode_reply_value(False) == b"\x56\x00"
    assert encode_reply_value({"durable": True}).endswith(b"durable\x56\x01")
