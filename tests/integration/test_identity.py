"""The OPEN properties RabbitMQ's clients check, and a delivery's message-annotations section."""

from __future__ import annotations

from collections.abc import Callable

from integration.conftest import RunningServer
from proton import Message
from proton.utils import BlockingConnection
from support.clients import consume, publish
from support.raw_client import RawClient


def _open_properties(running: RunningServer) -> dict[str, object]:
    connection = BlockingConnection(running.url)
    try:
        assert connection.conn is not None
        return dict(connection.conn.remote_properties or {})
    finally:
        connection.close()


def test_rabbitmq_compatible_by_default(server: RunningServer) -> None:
    properties = _open_properties(server)
    assert properties["product"] == "RabbitMQ"
    assert properties["version"] == "4.2.0"
    assert properties["sluicegate-product"] == "sluicegate"
    assert properties["sluicegate-version"] == "0.1.0"


def test_compatibility_can_be_turned_off(make_server: Callable[..., RunningServer]) -> None:
    properties = _open_properties(make_server(rabbitmq_compatible=False))
    assert properties == {"product": "sluicegate", "version": "0.1.0"}


def test_every_delivery_carries_exchange_and_routing_key(server: RunningServer) -> None:
    publish(server.url, "/queues/identity-annotations", ["one", "two"])
    received = consume(server.url, "/queues/identity-annotations", 2)
    assert received.bodies == ["one", "two"]
    for message in received.messages:
        assert message.annotations == {
            "x-exchange": "",
            "x-routing-key": "identity-annotations",
        }


def test_a_message_that_is_not_amqp_sections_is_rejected_with_decode_error(
    server: RunningServer,
) -> None:
    """The annotations cannot be placed in bytes that are not sections: nothing is stored."""
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach("malformed-publisher", "sender", target="/queues/identity-bad")
        client.wait_attach(handle)
        client.wait_credit(handle)
        bad = client.send(handle, b"\x01\x02\x03")
        good = client.send(handle, Message(body="fine").encode())
        outcomes = client.wait_outcomes([bad, good])
    rejected = outcomes[bad]
    assert rejected is not None
    assert rejected.name == "rejected"
    assert rejected["error"]["condition"] == "amqp:decode-error"
    accepted = outcomes[good]
    assert accepted is not None
    assert accepted.name == "accepted"
    assert server.queue("identity-bad").ready == 1
