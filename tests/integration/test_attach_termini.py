"""The termini an ATTACH reply states, field by field, against RabbitMQ's session's reply.

RabbitMQ states back the client's source and target as they came, but for a consumer's source:
its filter is the one in force (test_queues.py, test_stream_filters.py), its outcomes are the
client's when the server takes every one of them, all four when the client lists none, and a
link listing another is refused with ``amqp:not-implemented``. sluicegate does the same, with
one difference: RabbitMQ also states ``default-outcome`` released, which proton's terminus
cannot carry (proton-c has no such field), so the reply omits it. The settle modes are
test_attach_conformance.py's.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from integration.conftest import RunningServer
from proton import Array, Data, symbol, uint
from proton._data import UNDESCRIBED
from support.frames import described
from support.raw_client import RawClient

from sluicegate.gateway.rules.outcomes import OUTCOMES

ACCEPTED_RELEASED: Final = ("amqp:accepted:list", "amqp:released:list")


def _symbols(*names: str) -> Array:
    # proton types an Array's descriptor as data; UNDESCRIBED is its own sentinel.
    undescribed: Any = UNDESCRIBED
    return Array(undescribed, Data.SYMBOL, *map(symbol, names))


def test_a_consumers_source_fields_are_stated_back_as_asked(server: RunningServer) -> None:
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach(
            "consumer",
            "receiver",
            source="/queues/termini-consumer",
            target="consumer",
            distribution_mode="move",
            capabilities=["queue"],
            expiry_policy="never",
            terminus={
                "durable": uint(2),
                "timeout": uint(30),
                "outcomes": _symbols(*ACCEPTED_RELEASED),
                "default_outcome": described("modified", delivery_failed=True),
            },
        )
        attached = client.wait_attach(handle)
    assert attached.error is None
    source = attached.source
    assert source is not None
    assert source["address"] == "/queues/termini-consumer"
    assert source["durable"] == 2  # unsettled-state
    assert source["expiry_policy"] == "never"
    assert source["timeout"] == 30
    assert source["dynamic"] is False
    assert source["distribution_mode"] == "move"
    assert source["outcomes"] == list(ACCEPTED_RELEASED)
    assert source["capabilities"] == ["queue"]
    # RabbitMQ states released; proton's terminus cannot carry one (the module's docstring).
    assert source["default_outcome"] is None
    target = attached.target
    assert target is not None
    assert target["address"] == "consumer"


def test_a_consumer_that_lists_no_outcomes_is_told_the_four_the_server_takes(
    server: RunningServer,
) -> None:
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach(
            "consumer", "receiver", source="/queues/termini-default", target="consumer"
        )
        attached = client.wait_attach(handle)
    assert attached.error is None
    assert attached.source is not None
    assert attached.source["outcomes"] == list(OUTCOMES)
    assert attached.source["durable"] == 0
    assert attached.source["timeout"] == 0


@pytest.mark.parametrize("outcome", ["amqp:declared:list", "amqp:received:list", "x-own"])
def test_a_consumer_listing_an_outcome_the_server_does_not_take_is_refused(
    server: RunningServer, outcome: str
) -> None:
    """Refused before anything is made: the queue the address would declare is not there."""
    queue = f"termini-refused-{len(outcome)}"
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach(
            "consumer",
            "receiver",
            source=f"/queues/{queue}",
            target="consumer",
            terminus={"outcomes": _symbols("amqp:accepted:list", outcome)},
        )
        attached = client.wait_attach(handle)
        assert attached.source is None
        assert attached.error is not None
        assert attached.error["condition"] == "amqp:not-implemented"
        assert outcome in attached.error["description"]
        # The connection and its session go on: another link on it is served.
        other = client.attach("other", "receiver", source="/queues/termini-after", target="other")
        assert client.wait_attach(other).error is None
    assert server.call(lambda: server.server.registry.get(queue)) is None


def test_a_publishers_target_and_source_fields_are_stated_back_as_asked(
    server: RunningServer,
) -> None:
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach(
            "publisher",
            "sender",
            source="publisher",
            target="/queues/termini-publisher",
            capabilities=["queue"],
            expiry_policy="link-detach",
            terminus={"durable": uint(1), "timeout": uint(7)},
        )
        attached = client.wait_attach(handle)
    assert attached.error is None
    target = attached.target
    assert target is not None
    assert target["address"] == "/queues/termini-publisher"
    assert target["durable"] == 1  # configuration
    assert target["expiry_policy"] == "link-detach"
    assert target["timeout"] == 7
    assert target["dynamic"] is False
    assert target["capabilities"] == ["queue"]
    source = attached.source
    assert source is not None
    assert source["address"] == "publisher"
