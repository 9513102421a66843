"""JMS selectors: the grammar, SQL's three-valued logic, the JMS header fields, and the limits
checked at attach."""

from __future__ import annotations

import pytest

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.expression import ExpressionFilter
from sluicegate.queues.filters.selector import parse_selector
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.wire.amqp_types import Described, Value
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import Header, encode_header


def _selector(text: str) -> ExpressionFilter:
    return parse_selector(text, ViewCache(), Clock())


def _message(
    application: dict[Value, Value], *, priority: int = 4, durable: bool = False
) -> Message:
    payload = encode_header(Header(durable=durable, priority=priority))
    payload += b"\x00\x53\x73" + encode(["id-1", None, None, "order"])
    payload += b"\x00\x53\x74" + encode(application)
    return Message(payload + encode(Described(0x77, "body")))


_PROPS: dict[Value, Value] = {
    "region": "eu-west",
    "amount": 120,
    "rate": 0.5,
    "vip": True,
    "quote": "it's",
}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("region = 'eu-west'", True),
        ("region <> 'eu-west'", False),
        ("amount > 100 AND rate < 1", True),
        ("amount > 100 AND rate > 1", False),
        ("amount < 100 OR vip = TRUE", True),
        ("NOT (amount > 100)", False),
        ("amount BETWEEN 100 AND 200", True),
        ("amount NOT BETWEEN 100 AND 200", False),
        ("region IN ('eu-west', 'us-east')", True),
        ("region NOT IN ('eu-west')", False),
        ("region LIKE 'eu-%'", True),
        ("region LIKE 'eu_west'", True),
        ("region LIKE 'us%'", False),
        ("quote = 'it''s'", True),
        ("amount * 2 + 10 = 250", True),
        ("amount / 7 = 17", True),
        ("-amount < 0", True),
        ("missing IS NULL", True),
        ("region IS NOT NULL", True),
        # Unknown (a missing property) is not true, and NOT unknown is still unknown.
        ("missing = 1", False),
        ("NOT (missing = 1)", False),
        ("missing = 1 OR amount = 120", True),
        # Values of different kinds are never equal (JMS 2.0 §3.8.1.2), so they are unequal.
        ("region = 5", False),
        ("amount = '120'", False),
        ("NOT (amount = '120')", True),
        ("amount <> '120'", True),
        ("vip = 1", False),
        # Java's integer division truncates toward zero; % keeps the dividend's sign.
        ("-amount / 7 = -17", True),
        ("amount / 7.5 = 16", True),
        ("-7 % 5 = -2", True),
        ("region > 'eu'", True),
        ("region LIKE 'EU%'", False),
        ("region IN ('us', 'eu-west') AND NOT amount IN (1, 2)", True),
        ("and_more IS NULL and AMOUNT IS NULL", True),
        ("JMSPriority BETWEEN 4 AND 4.0 AND JMSPriority / 3 = 1", True),
        ("JMSPriority = 4", True),
        ("JMSType = 'order' AND JMSMessageID = 'id-1'", True),
        ("JMSDeliveryMode = 'NON_PERSISTENT'", True),
        ("amount = 1.2E2", True),
    ],
)
def test_selector_semantics(selector: str, selected: bool) -> None:
    assert _selector(selector)(_message(_PROPS)) is selected


def test_like_with_escape() -> None:
    message = _message({"code": "50%_off"})
    assert _selector("code LIKE '50!%!_off' ESCAPE '!'")(message)
    assert not _selector("code LIKE '50!%!_of' ESCAPE '!'")(message)


@pytest.mark.parametrize(
    "text", ["", "region =", "region = 'x' AND", "(a = 1", "a LIKE 5", "a NOT = 1", "a = 'x"]
)
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(InvalidFilter, match="selector"):
        _selector(text)


def test_a_message_without_application_properties_is_not_selected() -> None:
    assert not _selector("region = 'eu'")(Message(encode(Described(0x77, "x"))))
    assert _selector("region IS NULL")(Message(encode(Described(0x77, "x"))))


def test_jms_header_fields_read_the_header_and_properties() -> None:
    message = _message(_PROPS, priority=9, durable=True)
    assert _selector("JMSPriority = 9 AND JMSDeliveryMode = 'PERSISTENT'")(message)
    assert _selector("JMSCorrelationID IS NULL AND JMSMessageID LIKE 'id-_'")(message)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a=1" + " OR a=1" * 200, "more than 512 tokens"),
        ("a = '" + "x" * 5000 + "'", "longer than 4096"),
        ("(" * 40 + "a = 1" + ")" * 40, "nested deeper than 32"),
        ("NOT " * 40 + "a = 1", "nested deeper than 32"),
        ("- " * 40 + "a = 1", "nested deeper than 32"),
        ("a" + " + a" * 70 + " = 1", "nested deeper than 64"),
        ("(" * 3000 + "a = 1" + ")" * 3000, "longer than"),
        ("a LIKE 'x!' ESCAPE '!'", "ESCAPE"),
        ("a LIKE 'x' ESCAPE 'ab'", "single character"),
    ],
)
def test_selectors_beyond_the_limits_are_refused_at_attach(text: str, reason: str) -> None:
    with pytest.raises(InvalidFilter, match=reason) as refused:
        _selector(text)
    assert refused.value.condition == "amqp:invalid-field"


def test_long_chains_of_and_and_or_do_not_nest() -> None:
    text = " OR ".join(f"region = 'r{i}'" for i in range(120)) + " OR region = 'eu-west'"
    assert _selector(text)(_message(_PROPS))
