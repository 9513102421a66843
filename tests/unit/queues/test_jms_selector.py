"""JMS selectors: the grammar, SQL's three-valued logic, and the JMS header fields."""

from __future__ import annotations

import pytest

from sluicegate.queues.filters import InvalidFilter
from sluicegate.queues.message import Message
from sluicegate.queues.selector import Selector
from sluicegate.wire.codec import Described, Value, encode
from sluicegate.wire.sections import Header, encode_header


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
        # Mismatched types compare as unknown.
        ("region = 5", False),
        ("amount = '120'", False),
        ("JMSPriority = 4", True),
        ("JMSType = 'order' AND JMSMessageID = 'id-1'", True),
        ("JMSDeliveryMode = 'NON_PERSISTENT'", True),
        ("amount = 1.2E2", True),
    ],
)
def test_selector_semantics(selector: str, selected: bool) -> None:
    assert Selector(selector)(_message(_PROPS)) is selected


def test_like_with_escape() -> None:
    message = _message({"code": "50%_off"})
    assert Selector("code LIKE '50!%!_off' ESCAPE '!'")(message)
    assert not Selector("code LIKE '50!%!_of' ESCAPE '!'")(message)


@pytest.mark.parametrize(
    "text", ["", "region =", "region = 'x' AND", "(a = 1", "a LIKE 5", "a NOT = 1", "a = 'x"]
)
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(InvalidFilter, match="selector"):
        Selector(text)


def test_a_message_without_application_properties_is_not_selected() -> None:
    assert not Selector("region = 'eu'")(Message(encode(Described(0x77, "x"))))
    assert Selector("region IS NULL")(Message(encode(Described(0x77, "x"))))
