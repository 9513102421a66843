"""Publish outcomes where RabbitMQ 4's differ from a plain refusal (``rabbit_amqp_session``):
a ``to`` naming a missing queue is unroutable (released, the link stays), and a message to a
link's exchange deleted since is released and its link detached with ``amqp:not-found``."""

from __future__ import annotations

from integration.conftest import RunningServer
from proton import Message
from support.raw_client import RawClient

from sluicegate.clients.management import ManagementClient


def _encoded(address: str | None = None) -> bytes:
    encoded: bytes = Message(body="x", address=address).encode()
    return encoded


def test_a_to_naming_a_missing_queue_is_released_and_the_link_stays(
    server: RunningServer,
) -> None:
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach("anonymous", "sender", source="s", target=None)
        client.wait_attach(handle)
        client.wait_credit(handle)
        missing = client.send(handle, _encoded("/queues/outcomes-missing"))
        outcome = client.wait_outcomes([missing])[missing]
        assert outcome is not None
        assert outcome.name == "released"
        with ManagementClient(server.url) as management:
            assert management.request("PUT", "/queues/outcomes-there", {}).status == 201
        there = client.send(handle, _encoded("/queues/outcomes-there"))
        outcome = client.wait_outcomes([there])[there]
        assert outcome is not None
        assert outcome.name == "accepted"
        assert client.links[handle].detach_frame is None
    assert server.queue("outcomes-there").ready == 1


def test_a_message_to_a_deleted_exchange_is_released_and_its_link_detached(
    server: RunningServer,
) -> None:
    exchange = {"type": "fanout", "durable": True, "internal": False, "arguments": {}}
    with ManagementClient(server.url) as management:
        assert management.request("PUT", "/exchanges/outcomes-x", exchange).status == 204
        with RawClient.connect(server.host, server.port) as client:
            client.begin()
            doomed = client.attach("to-x", "sender", source="s", target="/exchanges/outcomes-x")
            other = client.attach("other", "sender", source="o", target="/queues/outcomes-other")
            client.wait_attach(doomed)
            client.wait_attach(other)
            client.wait_credit(doomed)
            assert management.request("DELETE", "/exchanges/outcomes-x").status == 204
            delivery = client.send(doomed, _encoded())
            outcome = client.wait_outcomes([delivery])[delivery]
            assert outcome is not None
            assert outcome.name == "released"
            detach = client.wait_for("detach")
            assert detach["error"]["condition"] == "amqp:not-found"
            assert "outcomes-x" in detach["error"]["description"]
            # The connection and its other links carry on.
            client.wait_credit(other)
            kept = client.send(other, _encoded())
            outcome = client.wait_outcomes([kept])[kept]
            assert outcome is not None
            assert outcome.name == "accepted"
