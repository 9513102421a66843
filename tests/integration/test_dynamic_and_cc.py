"""RabbitMQ 4.1's AMQP 1.0 additions besides filters: ``x-cc`` routing keys and dynamic
termini with the capability ``temporary-queue``, driven by proton's own client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from integration.conftest import RunningServer
from proton import Array, Data, Link, Message, Terminus, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, LinkDetached
from support.clients import consume, publish
from support.polling import wait_until

TEMPORARY = symbol("temporary-queue")


@pytest.fixture
def connection(server: RunningServer) -> Iterator[BlockingConnection]:
    opened = BlockingConnection(server.url, timeout=30)
    yield opened
    opened.close()


def _cc(*keys: str) -> dict[symbol, object]:
    return {symbol("x-cc"): list(keys)}


def test_x_cc_adds_routing_keys_through_the_exchange_and_to_queue_addresses(
    server: RunningServer,
) -> None:
    def declare() -> None:
        registry = server.server.registry
        registry.declare_exchange("cc-topic", "topic")
        for name in ("cc-eu", "cc-us", "cc-all", "cc-direct"):
            registry.declare_queue(name)
        registry.bind("cc-topic", "cc-eu", "orders.eu")
        registry.bind("cc-topic", "cc-us", "orders.us")
        registry.bind("cc-topic", "cc-all", "orders.*")

    server.call(declare)
    sent = [
        Message(body="eu and us", annotations=_cc("orders.us")),
        Message(body="eu only"),
    ]
    assert publish(server.url, "/exchanges/cc-topic/orders.eu", messages=sent).outcomes == [
        "accepted",
        "accepted",
    ]
    assert consume(server.url, "/queues/cc-us", 1).bodies == ["eu and us"]
    # A queue reached by several keys gets one copy.
    assert server.queue("cc-all").ready == 2
    assert server.queue("cc-eu").ready == 2
    # A queue address routes through the default exchange: x-cc names more queues.
    to_queue = [Message(body="both", annotations=_cc("cc-direct"))]
    assert publish(server.url, "/queues/cc-eu", messages=to_queue).outcomes == ["accepted"]
    assert consume(server.url, "/queues/cc-direct", 1).bodies == ["both"]
    bad = [Message(body="bad", annotations={symbol("x-cc"): "not a list"})]
    assert publish(server.url, "/queues/cc-eu", messages=bad).outcomes == ["rejected"]


class _Temporary(LinkOption):
    """A dynamic terminus asking for a temporary queue, as RabbitMQ's clients ask."""

    def apply(self, link: Link) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.dynamic = True
        terminus.expiry_policy = Terminus.EXPIRE_WITH_LINK
        terminus.capabilities.put_object(Array(Data.NULL, Data.SYMBOL, TEMPORARY))


def test_a_dynamic_source_gets_a_temporary_queue_gone_with_its_link(
    connection: BlockingConnection, server: RunningServer
) -> None:
    receiver = connection.create_receiver(None, credit=10, dynamic=True, options=_Temporary())
    address = receiver.link.remote_source.address
    assert address is not None
    assert address.startswith("/queues/amq.dyn-")
    name = address.removeprefix("/queues/")
    # Another connection may publish to it; only its own connection consumes from it.
    assert publish(server.url, address, ["for the requester"]).outcomes == ["accepted"]
    assert receiver.receive(timeout=10).body == "for the requester"
    other = BlockingConnection(server.url, timeout=30)
    try:
        with pytest.raises(LinkDetached, match="resource-locked"):
            other.create_receiver(address)
    finally:
        other.close()
    receiver.close()  # type: ignore[no-untyped-call]
    wait_until(lambda: server.call(lambda: server.server.registry.get(name)) is None)


def test_a_dynamic_target_gets_a_temporary_queue_to_publish_to(
    connection: BlockingConnection, server: RunningServer
) -> None:
    sender = connection.create_sender(None, options=_Temporary())
    address = sender.link.remote_target.address
    assert address is not None
    assert address.startswith("/queues/amq.dyn-")
    sender.send(Message(body="into the temporary queue"))
    receiver = connection.create_receiver(address, credit=1)
    assert receiver.receive(timeout=10).body == "into the temporary queue"
    name = address.removeprefix("/queues/")
    # The queue goes with the link that made it: its other links are told, as RabbitMQ does.
    with pytest.raises(LinkDetached, match="resource-deleted"):
        sender.close()  # type: ignore[no-untyped-call]
    assert server.call(lambda: server.server.registry.get(name)) is None
    assert receiver.link.state & Link.REMOTE_CLOSED


def test_temporary_queues_go_with_their_connection(server: RunningServer) -> None:
    owner = BlockingConnection(server.url, timeout=30)
    receiver = owner.create_receiver(None, credit=1, dynamic=True, options=_Temporary())
    name = (receiver.link.remote_source.address or "").removeprefix("/queues/")
    assert server.call(lambda: server.server.registry.get(name)) is not None
    owner.close()
    wait_until(lambda: server.call(lambda: server.server.registry.get(name)) is None)
