"""A reply's body encoded with its size counted (gateway/management/reply_size.py)."""

from __future__ import annotations

import pytest

from sluicegate.gateway.management.encoding import encode_reply_value
from sluicegate.gateway.management.node import encode_reply
from sluicegate.gateway.management.reply_size import ReplyTooLarge, encode_within
from sluicegate.gateway.rules.management.requests import Response
from sluicegate.wire.amqp_types import UInt, ULong

_QUEUE = {
    "name": "q",
    "arguments": {"x-wide": "w" * 300, "x-max-length": 10},
    "replicas": ["node"],
    "message_count": ULong(3),
    "consumer_count": UInt(1),
}


@pytest.mark.parametrize(
    "value",
    [
        None,
        "x" * 300,
        [],
        {},
        [_QUEUE] * 3,
        [_QUEUE] * 300,
        {"items": [_QUEUE] * 20, "page": 1, "page_count": 1, "total_count": 20},
    ],
    ids=["null", "string", "empty-list", "empty-map", "list", "long-list", "page"],
)
def test_within_its_limit_a_body_is_encoded_as_encode_value_encodes_it(value: object) -> None:
    encoded = encode_reply_value(value)
    assert encode_within(value, len(encoded)) == encoded


def test_a_body_past_its_limit_is_refused_at_the_element_that_passes_it() -> None:
    listing = [_QUEUE] * 1000
    with pytest.raises(ReplyTooLarge):
        encode_within(listing, 10_000)
    with pytest.raises(ReplyTooLarge):
        encode_within({"items": listing, "page": 1}, 10_000)


def test_a_reply_past_its_limit_becomes_a_400_that_says_to_page() -> None:
    reply = encode_reply(Response(200, [_QUEUE] * 1000), "r1", limit=10_000)
    assert len(reply) < 1000
    assert b"400" in reply
    assert b"smaller pages" in reply
    assert encode_reply(Response(200, [_QUEUE]), "r1", limit=10_000) == encode_reply(
        Response(200, [_QUEUE]), "r1"
    )
