"""RabbitMQ 4.1's AMQP 1.0 additions besides filters: ``x-cc`` routing keys and dynamic
termini with the capability ``temporary-queue``, driven by proton's own client."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from integration.conftest import RunningServer
from proton import Array, Data, Described, Endpoint, Link, Message, Terminus, symbol
from proton.reactor import AtMostOnce, Filter, LinkOption
from proton.utils import BlockingConnection, LinkDetached
from support.clients import consume, publish
from support.polling import wait_until

from sluicegate.gateway.rules.auth import parse_users
from sluicegate.gateway.rules.vhosts import parse_vhosts

TEMPORARY = symbol("temporary-queue")
VOLATILE = symbol("rabbitmq:volatile-queue")


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


class _Dynamic(LinkOption):
    """A dynamic source as RabbitMQ's clients ask for either node (issue 31's attacker's)."""

    def __init__(self, capability: symbol) -> None:
        self.capability = capability

    def apply(self, link: Link) -> None:
        source = link.source
        source.dynamic = True
        source.expiry_policy = Terminus.EXPIRE_WITH_LINK
        source.durability = Terminus.NONDURABLE
        source.timeout = 0
        source.capabilities.put_object(Array(Data.NULL, Data.SYMBOL, self.capability))


# A JMS selector that does not parse: the attach is refused with amqp:invalid-field.
_BAD_SELECTOR = Filter(
    {symbol("bad"): Described(symbol("apache.org:selector-filter:string"), "a = = (")}
)


def _nodes(running: RunningServer) -> tuple[int, int]:
    """The queues and the Direct Reply-To queues of the default virtual host."""
    registry = running.server.registry
    return running.call(lambda: (len(registry.queue_names()), len(registry._volatile)))


def test_refused_dynamic_sources_leave_nothing_and_lock_no_one_out(
    make_server: Callable[..., RunningServer],
) -> None:
    """Issue 31: 3,000 temporary queues stayed behind attaches refused for a bad selector, for
    good, and 20 locked a ``max_queues = 20`` vhost out; refused Direct Reply-To attaches each
    left a reply queue. Options are now read before a node is made."""
    running = make_server(vhosts=parse_vhosts({"/": {"max_queues": 5}}))
    connection = BlockingConnection(running.url, timeout=30)
    try:
        for capability in (TEMPORARY, VOLATILE):
            for index in range(100):
                with pytest.raises(LinkDetached, match="invalid-field"):
                    connection.create_receiver(
                        None,
                        name=f"refused-{capability}-{index}",
                        dynamic=True,
                        options=[AtMostOnce(), _Dynamic(capability), _BAD_SELECTOR],
                    )
        assert _nodes(running) == (0, 0)
        # The vhost's five queues are all still there to take, on the same connection.
        for index in range(5):
            receiver = connection.create_receiver(
                None, name=f"kept-{index}", dynamic=True, options=_Dynamic(TEMPORARY)
            )
            assert (receiver.link.remote_source.address or "").startswith("/queues/amq.dyn-")
        assert _nodes(running) == (5, 0)
    finally:
        connection.close()
    wait_until(lambda: _nodes(running) == (0, 0))


def test_temporary_queues_go_with_their_session(server: RunningServer) -> None:
    """A session's END detaches its links: the temporary queues they made go at once, not when
    the connection closes."""
    connection = BlockingConnection(server.url, timeout=30)
    try:
        assert connection.conn is not None
        session = connection.conn.session()
        session.open()
        receiver = session.receiver("session-temporary")
        _Dynamic(TEMPORARY).apply(receiver)
        receiver.open()
        sender = session.sender("session-temporary-target")
        _Temporary().apply(sender)
        sender.open()
        connection.wait(
            lambda: bool(receiver.remote_source.address and sender.remote_target.address),
            timeout=30,
        )
        names = [
            address.removeprefix("/queues/")
            for address in (receiver.remote_source.address, sender.remote_target.address)
            if address is not None
        ]
        registry = server.server.registry
        assert server.call(lambda: [registry.get(name) is not None for name in names]) == [
            True,
            True,
        ]
        session.close()
        connection.wait(lambda: bool(session.state & Endpoint.REMOTE_CLOSED), timeout=30)
        wait_until(lambda: server.call(lambda: all(registry.get(name) is None for name in names)))
        # The connection carries on.
        assert publish(server.url, "/queues/after-session-end", ["on"]).outcomes == ["accepted"]
    finally:
        connection.close()


def test_dynamic_sources_obey_permissions(make_server: Callable[..., RunningServer]) -> None:
    """A temporary queue needs *configure* and *read* on its name, a Direct Reply-To queue
    *read*; a refused attach leaves nothing, and the connection carries on."""
    running = make_server(
        users=parse_users(
            {"anonymous": {"configure": "", "write": ".*", "read": "^amq\\.rabbitmq\\.reply-to\\."}}
        )
    )
    connection = BlockingConnection(running.url, timeout=30)
    try:
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            connection.create_receiver(None, dynamic=True, options=_Dynamic(TEMPORARY))
        receiver = connection.create_receiver(
            None, dynamic=True, options=[AtMostOnce(), _Dynamic(VOLATILE)]
        )
        assert (receiver.link.remote_source.address or "").startswith(
            "/queues/amq.rabbitmq.reply-to."
        )
        assert _nodes(running) == (0, 1)
    finally:
        connection.close()
    wait_until(lambda: _nodes(running) == (0, 0))
    denied = make_server(
        users=parse_users({"anonymous": {"configure": ".*", "write": ".*", "read": "^public"}})
    )
    connection = BlockingConnection(denied.url, timeout=30)
    try:
        for capability in (TEMPORARY, VOLATILE):
            with pytest.raises(LinkDetached, match="unauthorized-access"):
                connection.create_receiver(
                    None, dynamic=True, options=[AtMostOnce(), _Dynamic(capability)]
                )
        assert _nodes(denied) == (0, 0)
        public = connection.create_receiver("/queues/public-q", credit=1)
        assert public.link.remote_source.address == "/queues/public-q"
    finally:
        connection.close()
