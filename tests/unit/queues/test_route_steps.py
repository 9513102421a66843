"""One message's routing is walked once for all its routing keys and bounded as a whole
(queues/route_steps.py): walked once per ``x-cc`` key, 256 keys through a fanout bound to 2,000
exchanges took 368 ms of the reactor for a message that went nowhere."""

from __future__ import annotations

import pytest

from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.exchanges import Exchange
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.route_steps import MAX_ROUTE_STEPS

# As many x-cc keys as a message may name (gateway/rules/routing.py's DEFAULT_MAX_CC_KEYS).
KEYS = [f"key-{n}" for n in range(256)]
WIDE = 2_000


def test_x_cc_keys_through_a_fanout_of_exchanges_visit_each_exchange_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = QueueRegistry()
    registry.declare_exchange("wide", "fanout")
    registry.declare_queue("end")
    for n in range(WIDE):
        registry.declare_exchange(f"x{n}", "fanout")
        registry.bind("wide", f"x{n}", "", to_exchange=True)
    registry.bind("x7", "end")
    visits = 0
    route = Exchange.route

    def counted(exchange: Exchange, routing_key: str, *rest: object) -> object:
        nonlocal visits
        visits += 1
        return route(exchange, routing_key, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(Exchange, "route", counted)
    assert [q.name for q in registry.route_keys("wide", KEYS)] == ["end"]
    # Once each (the old walk: 256 times each, 512,256 visits).
    assert visits == WIDE + 1


def test_keys_fanned_to_keyed_exchanges_are_refused_past_the_messages_steps() -> None:
    """Each topic exchange a fanout feeds looks every key up: the keys times the exchanges,
    and each match's states, are one message's steps, refused past them, where each match
    alone stayed under its own bound."""
    registry = QueueRegistry()
    registry.declare_exchange("wide", "fanout")
    registry.declare_queue("end")
    fed = MAX_ROUTE_STEPS // len(KEYS) + 1
    for n in range(fed):
        registry.declare_exchange(f"t{n}", "topic")
        registry.bind("wide", f"t{n}", "", to_exchange=True)
        registry.bind(f"t{n}", "end", "#")
    assert [q.name for q in registry.route("wide", "one")] == ["end"]
    assert [q.name for q in registry.route_keys("wide", KEYS[:8])] == ["end"]
    with pytest.raises(ResourceLimitExceeded, match=f"more than {MAX_ROUTE_STEPS} steps"):
        registry.route_keys("wide", KEYS)


def test_a_key_that_goes_nowhere_takes_the_alternate_exchange_alone() -> None:
    """The alternate exchange of a keyed exchange gets the keys it routed nowhere, and only
    those, walked with the others' routes in the same pass."""
    registry = QueueRegistry()
    registry.declare_exchange("spare", "direct")
    registry.declare_exchange("main", "direct", arguments={"alternate-exchange": "spare"})
    for name in ("a", "b", "spare-a", "spare-c"):
        registry.declare_queue(name)
    registry.bind("main", "a", "a")
    registry.bind("main", "b", "b")
    registry.bind("spare", "spare-a", "a")
    registry.bind("spare", "spare-c", "c")
    routed = {q.name for q in registry.route_keys("main", ["a", "b", "c"])}
    assert routed == {"a", "b", "spare-c"}
