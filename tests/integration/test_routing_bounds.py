"""Routing work per message is bounded and other clients are served (issue 31).

A hostile tester published 3 messages naming 5,000 ``x-cc`` routing keys into a topic exchange
with 1,000 bindings: each key was matched against every binding, and other clients waited 14 to
31 s. Now ``x-cc`` names at most ``max_cc_keys`` distinct keys (more is ``rejected``), and a
topic exchange matches each key once over a trie of its binding keys (queues/topic_trie.py).
Message annotations are measured at the door like application-properties: over
``max_message_annotations_size`` the message is ``rejected`` unread (8 messages of 7.2 MB of
annotations kept others waiting 3.5 s).
"""

from __future__ import annotations

from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Message, symbol
from proton.utils import BlockingConnection
from support.clients import publish
from support.prober import Prober

from sluicegate.gateway.rules.routing import DEFAULT_MAX_CC_KEYS

# A served prober's round, with room for a loaded shared machine; the stalls were 3.5 to 31 s.
PROBE_BOUND: Final = 5.0
_BINDINGS: Final = 1000
_QUEUES: Final = 10


def _cc(keys: list[str]) -> dict[symbol, object]:
    return {symbol("x-cc"): keys}


def _topic_exchange(server: RunningServer, name: str) -> None:
    """1,000 bindings over 10 queues, half of them with wildcards that every key must try."""

    def declare() -> None:
        registry = server.server.registry
        registry.declare_exchange(name, "topic")
        for q in range(_QUEUES):
            registry.declare_queue(f"{name}-{q}")
        for b in range(_BINDINGS):
            key = f"k.{b}.#" if b % 2 else f"*.{b}.x"
            registry.bind(name, f"{name}-{b % _QUEUES}", key)

    server.call(declare)


def _refused_then_routed(
    server: RunningServer, address: str, refused: list[str], routed: list[str], naming: str
) -> None:
    """A message naming the ``refused`` x-cc keys is ``rejected`` with
    ``amqp:resource-limit-exceeded``, its description saying ``naming``; the next on the same
    link, naming ``routed``, is accepted."""
    connection = BlockingConnection(server.url)
    try:
        sender = connection.create_sender(address)
        delivery = sender.send(Message(body="big", annotations=_cc(refused)), error_states=[])
        assert delivery.remote_state == delivery.REJECTED
        condition = delivery.remote.condition
        assert condition is not None
        assert condition.name == "amqp:resource-limit-exceeded"
        assert naming in str(condition.description)
        ok = sender.send(Message(body="small", annotations=_cc(routed)))
        assert ok.remote_state == ok.ACCEPTED
    finally:
        connection.close()


def test_x_cc_over_the_limit_is_rejected_and_the_link_stays_open(server: RunningServer) -> None:
    """The tester's 5,000 keys: ``rejected`` with ``amqp:resource-limit-exceeded`` naming the
    setting; the next message on the same link is routed."""
    _topic_exchange(server, "cc-limit")
    keys = [f"k.{n}.x" for n in range(5000)]
    _refused_then_routed(
        server,
        "/exchanges/cc-limit/none",
        keys,
        ["k.1.x", "k.1.x", "k.3.x"],
        f"max_cc_keys {DEFAULT_MAX_CC_KEYS}",
    )
    # k.1.# and k.3.# bind queues 1 and 3; the key named twice routes once.
    assert server.queue("cc-limit-1").ready == 1
    assert server.queue("cc-limit-3").ready == 1
    assert sum(server.queue(f"cc-limit-{q}").ready for q in range(_QUEUES)) == 2


@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_x_cc_at_the_limit_through_many_bindings_leaves_others_served(
    server: RunningServer,
) -> None:
    """30 messages of ``max_cc_keys`` keys each, into 1,000 topic bindings: each message reaches
    the queues its keys match, once each, and a prober keeps being served."""
    _topic_exchange(server, "cc-many")
    # Key n matches binding "k.{n}.#" (odd n) or "*.{n}.x" (even n): queue n % 10 either way.
    keys = [f"k.{n}.x" for n in range(DEFAULT_MAX_CC_KEYS)]
    messages = [Message(body=f"m{i}", annotations=_cc(keys)) for i in range(30)]
    with Prober(server.url) as prober:
        prober.wait_rounds(2, timeout=60)
        published = publish(server.url, "/exchanges/cc-many/none", messages=messages)
        prober.wait_rounds(len(prober.seen.rounds) + 2, timeout=60)
    assert published.outcomes == ["accepted"] * 30
    assert [server.queue(f"cc-many-{q}").ready for q in range(_QUEUES)] == [30] * _QUEUES
    assert prober.seen.failures == []
    assert prober.seen.worst < PROBE_BOUND, prober.seen.rounds


@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_message_annotations_over_the_limit_are_rejected_unread(server: RunningServer) -> None:
    """Annotations of 0.9 MB: ``rejected`` with ``amqp:link:message-size-exceeded`` naming both
    sizes, the link open; the prober is served while 8 of them are refused."""
    address = "/queues/big-annotations"
    big = {symbol(f"x-{n:06d}"): "v" * 80 for n in range(10_000)}
    with Prober(server.url) as prober:
        prober.wait_rounds(2, timeout=60)
        published = publish(
            server.url,
            address,
            messages=[Message(body="big", annotations=big) for _ in range(8)]
            + [Message(body="small", annotations={symbol("x-a"): 1})],
        )
        prober.wait_rounds(len(prober.seen.rounds) + 2, timeout=60)
    assert published.outcomes == ["rejected"] * 8 + ["accepted"]
    connection = BlockingConnection(server.url)
    try:
        delivery = connection.create_sender(address).send(
            Message(body="big", annotations=big), error_states=[]
        )
        condition = delivery.remote.condition
        assert condition is not None
        assert condition.name == "amqp:link:message-size-exceeded"
        assert "max_message_annotations_size 65536" in str(condition.description)
    finally:
        connection.close()
    assert server.queue("big-annotations").ready == 1
    assert prober.seen.failures == []
    assert prober.seen.worst < PROBE_BOUND, prober.seen.rounds


@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_x_cc_keys_through_a_headers_exchange_read_the_headers_once(
    server: RunningServer,
) -> None:
    """A headers exchange bound onward to a topic exchange: every x-cc key is routed through it,
    and each routing read the message's 60 KB of application-properties again (some 50 ms each,
    256 keys: seconds per message). The headers are read once per message now."""

    def declare() -> None:
        registry = server.server.registry
        registry.declare_exchange("cc-headers", "headers")
        registry.declare_exchange("cc-onward", "topic")
        registry.bind(
            "cc-headers", "cc-onward", "", {"x-match": "any", "region": "eu"}, to_exchange=True
        )
        for q in range(_QUEUES):
            registry.declare_queue(f"cc-headers-{q}")
            registry.bind("cc-onward", f"cc-headers-{q}", f"k.{q}")

    server.call(declare)
    properties: dict[str, object] = {f"p{i:05d}": i for i in range(3_500)}
    properties["region"] = "eu"
    keys = [f"k.{n % _QUEUES}.{n}" for n in range(DEFAULT_MAX_CC_KEYS - _QUEUES)]
    keys += [f"k.{q}" for q in range(_QUEUES)]
    messages = [
        Message(body=f"m{i}", properties=properties, annotations=_cc(keys)) for i in range(5)
    ]
    with Prober(server.url) as prober:
        prober.wait_rounds(2, timeout=60)
        published = publish(server.url, "/exchanges/cc-headers/k.0", messages=messages)
        prober.wait_rounds(len(prober.seen.rounds) + 2, timeout=60)
    assert published.outcomes == ["accepted"] * 5
    assert [server.queue(f"cc-headers-{q}").ready for q in range(_QUEUES)] == [5] * _QUEUES
    assert prober.seen.failures == []
    assert prober.seen.worst < PROBE_BOUND, prober.seen.rounds


@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_x_cc_keys_through_a_fanout_of_exchanges_leave_others_served(
    server: RunningServer,
) -> None:
    """A fanout bound to 2,000 exchanges: each of a message's 256 ``x-cc`` keys walked them all
    again, 368 ms of the reactor for one message that went nowhere and was charged nothing. One
    walk for all the keys now; and a message whose walk would pass its steps (each of 40 topic
    exchanges fed by the fanout looks every key up) is ``rejected`` with
    ``amqp:resource-limit-exceeded``, the link open."""

    def declare() -> None:
        registry = server.server.registry
        registry.declare_exchange("cc-wide", "fanout")
        registry.declare_queue("cc-wide-end")
        for n in range(2_000):
            registry.declare_exchange(f"cc-wide-{n}", "fanout")
            registry.bind("cc-wide", f"cc-wide-{n}", "", to_exchange=True)
        registry.bind("cc-wide-7", "cc-wide-end")
        registry.declare_exchange("cc-keyed", "fanout")
        for n in range(40):
            registry.declare_exchange(f"cc-keyed-{n}", "topic")
            registry.bind("cc-keyed", f"cc-keyed-{n}", "", to_exchange=True)
            registry.bind(f"cc-keyed-{n}", "cc-wide-end", "#")

    server.call(declare)
    keys = [f"key.{n}" for n in range(DEFAULT_MAX_CC_KEYS)]
    with Prober(server.url) as prober:
        prober.wait_rounds(2, timeout=60)
        wide = publish(
            server.url,
            "/exchanges/cc-wide/none",
            messages=[Message(body=f"m{i}", annotations=_cc(keys)) for i in range(20)],
        )
        prober.wait_rounds(len(prober.seen.rounds) + 2, timeout=60)
    assert wide.outcomes == ["accepted"] * 20
    assert server.queue("cc-wide-end").ready == 20
    assert prober.seen.failures == []
    assert prober.seen.worst < PROBE_BOUND, prober.seen.rounds
    _refused_then_routed(
        server,
        "/exchanges/cc-keyed/none",
        keys,
        keys[:4],
        "steps through its exchanges' bindings",
    )
    assert server.queue("cc-wide-end").ready == 21
