"""AMQP SQL filter expressions as RabbitMQ 4.2 evaluates them: its identifiers, literals and
keywords, exact division, and the limits checked at attach."""

from __future__ import annotations

import uuid

import pytest

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.sql import parse_sql
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.wire.amqp_types import Described, Symbol, Timestamp, Value
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import Header, encode_header

_NOW = 1_750_000_000_000


def _message() -> Message:
    properties: list[Value] = [
        "msg-7",  # message-id
        b"alice",  # user-id
        "/queues/orders",  # to
        "order.created",  # subject
        None,  # reply-to
        uuid.UUID(int=5).bytes,  # correlation-id
        Symbol("application/json"),  # content-type
        None,
        None,
        Timestamp(_NOW - 1000),  # creation-time
        "group-a",  # group-id
        3,  # group-sequence
    ]
    application: dict[Value, Value] = {
        "country": "UK",
        "city": "London",
        "weight": 5,
        "price": 10.5,
        "temperature": -5,
        "active": True,
        "premium": False,
        "tag": Symbol("green"),
        "blob": b"\x01\x02",
        "key with spaces": "v",
        "[odd]": "brackets",
    }
    payload = encode_header(Header(priority=7))
    payload += b"\x00\x53\x73" + encode(properties)
    payload += b"\x00\x53\x74" + encode(application)
    return Message(payload + encode(Described(0x77, "body")))


def _selects(text: str) -> bool:
    return parse_sql(text, ViewCache(), Clock(_NOW))(_message())


@pytest.mark.parametrize(
    ("text", "selected"),
    [
        ("country = 'UK' AND weight = 5", True),
        ("country = \"UK\" AND city != 'Paris'", True),
        ("country > 'DE' AND 'Zurich' > city", True),
        ("weight > 4.99 AND price <= 10.5", True),
        # Exact division, and a remainder with the dividend's sign (RabbitMQ: Erlang's / and rem).
        ("weight / 2 = 2.5", True),
        ("7 % temperature = 2", True),
        ("weight % 0 = 0", False),
        ("price % 2 = 0.5", False),
        ("-temperature = 5 AND -(-weight) = 5", True),
        ("+country = 'UK'", False),
        # Kinds compare only with their kind; <> is the negation of =.
        ("weight = '5'", False),
        ("weight <> '5'", True),
        ("active = TRUE AND premium = FALSE", True),
        ("active > FALSE", False),
        ("active AND NOT premium", True),
        ("absent OR active", True),
        ("NOT absent", False),
        ("absent IS NULL AND country IS NOT NULL", True),
        ("country IN ('FR', 'UK') AND weight NOT IN (1, 2, 5.0)", False),
        ("country IN ('FR', city, 'UK')", True),
        ("absent IN ('x') OR absent NOT IN ('x')", False),
        ("city LIKE 'Lon%' AND city LIKE '_ondo_' AND city NOT LIKE '%x%'", True),
        ("weight LIKE '5'", False),
        ("tag = 'green'", True),
        ("blob = 0x0102 AND blob < 0x0103", True),
        ("[key with spaces] = 'v' AND [[[odd]]] = 'brackets'", True),
        ("a.country = 'UK' AND application_properties.weight = 5", True),
        ("header.priority = 7 AND h.priority > 4", True),
        ("p.subject LIKE 'order.%' AND properties.message_id = 'msg-7'", True),
        ("p.user_id = 0x616C696365 AND p.content_type = 'application/json'", True),
        ("p.group_sequence * 10 = 30 AND p.group_id = 'group-a'", True),
        ("p.creation_time < UTC() AND p.creation_time > UTC() - 2000", True),
        ("p.reply_to IS NULL AND p.absolute_expiry_time IS NULL", True),
        ("weight BETWEEN 1 AND 5", True),
        ("1.5E1 = 15 AND 0.5 * 2 = 1", True),
        ("country = 'UK' OR 1 / 0 = 1", True),
        ("weight", False),
    ],
)
def test_sql_semantics(text: str, selected: bool) -> None:
    assert _selects(text) is selected


def test_a_message_without_application_properties_selects_on_its_header() -> None:
    message = Message(encode_header(Header(priority=1)) + encode(Described(0x77, "x")))
    assert parse_sql("h.priority = 1 AND absent IS NULL", ViewCache(), Clock())(message)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("country = 'UK' and weight = 5", "reserved"),
        ("true", "reserved"),
        ("Like = 1", "reserved"),
        ("properties.nonsense = 1", "unsupported field"),
        ("header.durable = TRUE", "unsupported field"),
        ("x.country = 'UK'", "unsupported field"),
        ("country = 'UK", "unexpected"),
        ("country == 'UK'", "expected a value"),
        ("country = 'UK' AND", "expected a value"),
        ("a = 1 = 1", "unexpected"),
        ("UTC = 1", "expected \\("),
        ("", "empty"),
        ("a" + " OR a" * 300, "512 tokens"),
    ],
)
def test_malformed_sql_is_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidFilter, match=reason):
        parse_sql(text, ViewCache(), Clock())
