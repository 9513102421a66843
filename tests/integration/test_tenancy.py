"""Nobody gets in where they don't belong (issue 19), with real clients over loopback.

Permissions without side doors (dead-lettering, exchange-to-exchange bindings, alternate
exchanges), exclusive queues, listings, virtual hosts and RabbitMQ's vhost and user limits:
RabbitMQ's own AMQP 1.0 client (rabbitmq-amqp-python-client) where it has the operation, proton
and the raw client where a frame must be looked at.
"""

from __future__ import annotations

import functools
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Final

import pytest
from integration.conftest import RunningServer
from prometheus_client.parser import text_string_to_metric_families
from proton import ConnectionException, Message
from proton.utils import BlockingConnection, LinkDetached
from rabbitmq_amqp_python_client import (
    AmqpUri,
    ClassicQueueSpecification,
    Connection,
    Converter,
    Environment,
    ExchangeSpecification,
    ExchangeToExchangeBindingSpecification,
    ExchangeToQueueBindingSpecification,
    ExchangeType,
    ValidationCodeException,
)
from rabbitmq_amqp_python_client import Message as RabbitMessage
from rabbitmq_amqp_python_client.qpid.proton import ConnectionException as RabbitConnectionException
from support.clients import publish
from support.polling import wait_until
from support.rabbitmq import Accepting, Enough
from support.raw_client import ConnectionClosedError, RawClient

from sluicegate.clients.management import ManagementClient
from sluicegate.gateway.durability import VhostNotConfigured
from sluicegate.gateway.rules.auth import User, hash_password, parse_users
from sluicegate.gateway.rules.vhosts import VhostSettings, parse_vhosts

PASSWORD = "pw"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}
MINE = {"configure": "^mine", "write": "^mine", "read": "^mine"}


@functools.cache
def _users() -> dict[str, User]:
    """One scrypt hash shared by every test user: each hash costs tens of milliseconds."""
    hashed = hash_password(PASSWORD)
    return parse_users(
        {
            "admin": {
                "password_hash": hashed,
                "permissions": {"/": EVERYTHING, "tenant-a": EVERYTHING, "tenant-b": EVERYTHING},
            },
            "limited": {"password_hash": hashed, **MINE},
            "alice": {"password_hash": hashed, "permissions": {"tenant-a": EVERYTHING}},
            "bob": {"password_hash": hashed, "permissions": {"tenant-b": EVERYTHING}},
            "carol": {
                "password_hash": hashed,
                "permissions": {"tenant-b": EVERYTHING},
                "max_connections": 1,
                "max_sessions": 2,
            },
            "anonymous": {"configure": "", "write": "", "read": "^public"},
        }
    )


def _vhosts() -> dict[str, VhostSettings]:
    tenant_a = {"max_queues": 2, "max_connections": 2, "max_exchanges": 1, "max_bindings": 1}
    return parse_vhosts({"tenant-a": tenant_a, "tenant-b": {}})


@pytest.fixture(scope="module")
def tenants() -> Iterator[RunningServer]:
    """One server with users, the anonymous user and three virtual hosts for this module."""
    from integration.conftest import start_server

    running = start_server(users=_users(), vhosts=_vhosts())
    yield running
    running.stop()


@contextmanager
def rabbitmq_client(running: RunningServer, user: str, vhost: str = "/") -> Iterator[Connection]:
    """A connection of RabbitMQ's client into ``vhost`` (its ``AmqpUri.vhost`` option)."""
    uri = AmqpUri(host="127.0.0.1", port=running.port, user=user, password=PASSWORD, vhost=vhost)
    environment = Environment(amqp_uri=uri)
    connection = environment.connection()
    connection.dial()
    try:
        yield connection
    finally:
        connection.close()
        environment.close()


def _proton(running: RunningServer, user: str, vhost: str | None = None) -> BlockingConnection:
    return BlockingConnection(
        running.url,
        timeout=10,
        user=user,
        password=PASSWORD,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host=None if vhost is None else f"vhost:{vhost}",
    )


def _management(running: RunningServer, user: str, vhost: str | None = None) -> ManagementClient:
    url = f"amqp://{user}:{PASSWORD}@127.0.0.1:{running.port}"
    return ManagementClient(url, timeout=10, vhost=vhost)


def _refused_with(status: int, call: Callable[[], object]) -> None:
    with pytest.raises(ValidationCodeException, match=f"wrong response code received: {status}"):
        call()


def _ready(running: RunningServer, queue: str, vhost: str = "/") -> int:
    def read() -> int:
        found = running.server.tenancy.vhosts[vhost].registry.get(queue)
        return -1 if found is None else found.statistics().ready

    return running.call(read)


# -- permissions without side doors -----------------------------------------------------------


def test_dead_lettering_needs_write_where_the_dead_letters_go(tenants: RunningServer) -> None:
    """Issue 19 scenario 1: the dead-letter exchange and routing key are checked at declare."""
    with rabbitmq_client(tenants, "admin") as admin:
        management = admin.management()
        management.declare_queue(ClassicQueueSpecification(name="secret"))
        management.declare_exchange(
            ExchangeSpecification(name="events", exchange_type=ExchangeType.fanout)
        )
        management.bind(ExchangeToQueueBindingSpecification("events", "secret"))
    with rabbitmq_client(tenants, "limited") as limited:
        management = limited.management()
        # The default exchange with a routing key naming a queue limited may not write.
        by_key = ClassicQueueSpecification(
            name="mine-ttl",
            dead_letter_exchange="",
            dead_letter_routing_key="secret",
            message_ttl=timedelta(0),
        )
        _refused_with(403, lambda: management.declare_queue(by_key))
        # An exchange limited may not write.
        by_exchange = ClassicQueueSpecification(
            name="mine-full", dead_letter_exchange="events", max_len=0
        )
        _refused_with(403, lambda: management.declare_queue(by_exchange))
        # Where limited may write, dead-lettering works as before.
        allowed = ClassicQueueSpecification(
            name="mine-ttl",
            dead_letter_exchange="",
            dead_letter_routing_key="mine-dead",
            message_ttl=timedelta(0),
        )
        management.declare_queue(ClassicQueueSpecification(name="mine-dead"))
        management.declare_queue(allowed)
    connection = _proton(tenants, "limited")
    try:
        sender = connection.create_sender("/queues/mine-ttl")
        for index in range(5):
            sender.send(Message(body=f"private {index}"))
    finally:
        connection.close()
    wait_until(lambda: _ready(tenants, "mine-dead") == 5)
    assert _ready(tenants, "secret") == 0
    assert _ready(tenants, "mine-full") == -1


def test_an_exchange_to_exchange_binding_needs_write_on_the_destination(
    tenants: RunningServer,
) -> None:
    with rabbitmq_client(tenants, "admin") as admin:
        management = admin.management()
        for name in ("mine-events", "secret-events"):
            spec = ExchangeSpecification(name=name, exchange_type=ExchangeType.fanout)
            management.declare_exchange(spec)
    with rabbitmq_client(tenants, "limited") as limited:
        management = limited.management()
        management.declare_exchange(
            ExchangeSpecification(name="mine-x", exchange_type=ExchangeType.fanout)
        )
        into_secret = ExchangeToExchangeBindingSpecification("mine-events", "secret-events")
        _refused_with(403, lambda: management.bind(into_secret))
        # Reading from an exchange it may not read is refused too (RabbitMQ's binding check).
        from_secret = ExchangeToExchangeBindingSpecification("secret-events", "mine-x")
        _refused_with(403, lambda: management.bind(from_secret))
        management.bind(ExchangeToExchangeBindingSpecification("mine-events", "mine-x"))
    bindings = tenants.call(lambda: tenants.server.registry.bindings("mine-events"))
    assert [b.destination for b in bindings] == ["mine-x"]


def test_an_alternate_exchange_needs_write_on_it(tenants: RunningServer) -> None:
    with rabbitmq_client(tenants, "limited") as limited:
        management = limited.management()
        sneaky = ExchangeSpecification(
            name="mine-ae", arguments={"alternate-exchange": "secret-events"}
        )
        _refused_with(403, lambda: management.declare_exchange(sneaky))
        management.declare_exchange(
            ExchangeSpecification(name="mine-ae", arguments={"alternate-exchange": "mine-x"})
        )


# -- exclusive queues ------------------------------------------------------------------------


def test_an_exclusive_queue_belongs_to_the_connection_that_declared_it(
    tenants: RunningServer,
) -> None:
    """Issue 19 scenario 2: another connection cannot consume, purge, delete or bind it."""
    with rabbitmq_client(tenants, "admin") as owner:
        management = owner.management()
        management.declare_queue(
            ClassicQueueSpecification(name="private", is_exclusive=True, is_durable=False)
        )
        publisher = owner.publisher("/queues/private")
        publisher.publish(_rabbitmq_message("for the owner only"))
        other = _proton(tenants, "admin")
        try:
            with pytest.raises(LinkDetached, match="amqp:resource-locked"):
                other.create_receiver("/queues/private")
        finally:
            other.close()
        with _management(tenants, "admin") as stranger:
            bind = {"source": "amq.direct", "destination_queue": "private", "binding_key": "k"}
            for method, path, body in (
                ("DELETE", "/queues/private/messages", None),
                ("DELETE", "/queues/private", None),
                ("POST", "/bindings", bind),
                ("PUT", "/queues/private", {"exclusive": True, "durable": False}),
            ):
                reply = stranger.request(method, path, body)
                assert reply.status == 400, (method, path)
                assert "cannot obtain exclusive access to locked queue 'private'" in str(reply.body)
        assert _ready(tenants, "private") == 1
        handler = Accepting(1)
        consumer = owner.consumer("/queues/private", message_handler=handler)
        with pytest.raises(Enough):
            consumer.run()
        consumer.close()
        assert handler.bodies == ["for the owner only"]
    wait_until(lambda: _ready(tenants, "private") == -1)


def _rabbitmq_message(body: str) -> RabbitMessage:
    return RabbitMessage(body=Converter.string_to_bytes(body))


# -- listings --------------------------------------------------------------------------------


def test_listings_show_only_what_the_user_has_permissions_on(tenants: RunningServer) -> None:
    """Issue 19 scenario 4."""
    with _management(tenants, "admin") as admin:
        for name in ("public-news", "mine-listed", "hidden"):
            assert admin.request("PUT", f"/queues/{name}", {"durable": False}).ok
    with _management(tenants, "limited") as limited:
        listed = limited.request("GET", "/queues").body
        assert isinstance(listed, list)
        names = {queue["name"] for queue in listed}
        assert "mine-listed" in names
        assert all(name.startswith("mine") for name in names)
        assert limited.request("GET", "/queues/hidden").status == 403
    anonymous = ManagementClient(f"amqp://127.0.0.1:{tenants.port}", timeout=10)
    with anonymous:
        listed = anonymous.request("GET", "/queues").body
        assert isinstance(listed, list)
        assert [queue["name"] for queue in listed] == ["public-news"]
        exchanges = anonymous.request("GET", "/exchanges").body
        assert exchanges == []


# -- virtual hosts ---------------------------------------------------------------------------


def test_each_virtual_host_is_its_own_namespace(tenants: RunningServer) -> None:
    for user, vhost, count in (("alice", "tenant-a", 2), ("bob", "tenant-b", 3)):
        with rabbitmq_client(tenants, user, vhost) as connection:
            management = connection.management()
            info = management.declare_queue(ClassicQueueSpecification(name="orders"))
            assert info.name == "orders"
            publisher = connection.publisher("/queues/orders")
            for index in range(count):
                publisher.publish(_rabbitmq_message(f"{vhost} {index}"))
            publisher.close()
            raw = management.request({}, "/queues/orders", "GET", [200])
            body: object = raw.body
            assert isinstance(body, dict)
            assert body["vhost"] == vhost
    assert _ready(tenants, "orders", "tenant-a") == 2
    assert _ready(tenants, "orders", "tenant-b") == 3
    assert _ready(tenants, "orders", "/") == -1
    with rabbitmq_client(tenants, "admin", "tenant-b") as connection:
        handler = Accepting(3)
        consumer = connection.consumer("/queues/orders", message_handler=handler)
        with pytest.raises(Enough):
            consumer.run()
        consumer.close()
    bodies = handler.bodies
    assert sorted(bodies) == ["tenant-b 0", "tenant-b 1", "tenant-b 2"]
    assert _ready(tenants, "orders", "tenant-a") == 2


# RabbitMQ's Python client waits this long at least before it reconnects.
RECONNECT_DELAY: Final = 5.0
_REFUSED_AT_OPEN: Final = {
    ("admin", "no-such-vhost"): "virtual host 'no-such-vhost' does not exist",
    ("alice", "tenant-b"): "access to vhost 'tenant-b' refused for user 'alice'",
    ("alice", "/"): "access to vhost '/' refused for user 'alice'",
}


@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_open_is_refused_for_an_unknown_virtual_host_or_one_without_permissions(
    tenants: RunningServer,
) -> None:
    """Issue 19 scenario 5: RabbitMQ 4 refuses ``vhost:no-such-vhost`` at OPEN, by dropping the
    connection without OPEN or CLOSE (``rabbit_amqp_reader``): RabbitMQ's Python client raises
    then, where a CLOSE would have it reconnect without end."""
    for user, vhost in _REFUSED_AT_OPEN:
        with pytest.raises(ConnectionClosedError):
            RawClient.connect(
                tenants.host, tenants.port, plain=(user, PASSWORD), hostname=f"vhost:{vhost}"
            )
        with pytest.raises(ConnectionException):
            _proton(tenants, user, vhost)
        started = time.monotonic()
        with pytest.raises(RabbitConnectionException), rabbitmq_client(tenants, user, vhost):
            pass
        # Raised at once: no reconnection (the client waits 5 s or more before each).
        assert time.monotonic() - started < RECONNECT_DELAY
    wait_until(lambda: tenants.call(lambda: len(tenants.server.broker.connections)) == 0)
    # A plain hostname (what most clients send) means the default virtual host.
    with RawClient.connect(
        tenants.host, tenants.port, plain=("limited", PASSWORD), hostname="localhost"
    ) as client:
        client.begin()
        assert tenants.call(lambda: tenants.server.tenancy.default.connections) == 1
    wait_until(lambda: tenants.call(lambda: tenants.server.tenancy.default.connections) == 0)


def test_without_rabbitmq_compatibility_the_refusal_is_an_open_and_a_close_saying_why(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(users=_users(), vhosts=_vhosts(), rabbitmq_compatible=False)
    for (user, vhost), description in _REFUSED_AT_OPEN.items():
        with RawClient.connect(
            running.host, running.port, plain=(user, PASSWORD), hostname=f"vhost:{vhost}"
        ) as client:
            close = client.wait_for("close")
        assert close["error"]["condition"] == "amqp:not-allowed"
        assert close["error"]["description"] == description
        with pytest.raises(ConnectionException, match="amqp:not-allowed"):
            _proton(running, user, vhost)


# -- quotas ----------------------------------------------------------------------------------


def test_a_vhost_queue_limit_refuses_new_queues_and_nothing_else(tenants: RunningServer) -> None:
    """tenant-a: max_queues = 2 ("orders" from the namespace test may exist already)."""
    registry = tenants.server.tenancy.vhosts["tenant-a"].registry
    with RawClient.connect(
        tenants.host, tenants.port, plain=("alice", PASSWORD), hostname="vhost:tenant-a"
    ) as client:
        client.begin()
        handle = 0
        while tenants.call(lambda: registry.queue_count) < 2:
            handle += 1
            attached = client.wait_attach(
                client.attach(f"q{handle}", "sender", target=f"/queues/fill-{handle}")
            )
            assert attached.error is None
        refused = client.wait_attach(client.attach("over", "sender", target="/queues/one-more"))
        assert refused.error is not None
        assert refused.error["condition"] == "amqp:resource-limit-exceeded"
        assert refused.error["description"] == (
            "cannot declare queue 'one-more': queue limit in vhost 'tenant-a' (2) is reached"
        )
        # The same connection still attaches to queues that exist.
        existing = tenants.call(lambda: registry.queues()[0].name)
        again = client.wait_attach(client.attach("again", "sender", target=f"/queues/{existing}"))
        assert again.error is None
    with _management(tenants, "alice", "tenant-a") as management:
        reply = management.request("PUT", "/queues/one-more", {"durable": False})
        assert reply.status == 403
        assert "queue limit in vhost 'tenant-a' (2) is reached" in str(reply.body)
    # Another virtual host is not affected.
    with _management(tenants, "bob", "tenant-b") as management:
        assert management.request("PUT", "/queues/one-more", {"durable": False}).status == 201


def test_exchange_and_binding_limits(tenants: RunningServer) -> None:
    """tenant-a: max_exchanges = 1, max_bindings = 1 (sluicegate's own vhost limits)."""
    with rabbitmq_client(tenants, "alice", "tenant-a") as alice:
        management = alice.management()
        fanout = ExchangeType.fanout
        management.declare_exchange(ExchangeSpecification(name="x1", exchange_type=fanout))
        over = ExchangeSpecification(name="x2", exchange_type=fanout)
        _refused_with(403, lambda: management.declare_exchange(over))
        management.bind(ExchangeToExchangeBindingSpecification("x1", "amq.fanout"))
        again = ExchangeToExchangeBindingSpecification("amq.fanout", "x1")
        _refused_with(403, lambda: management.bind(again))
    with rabbitmq_client(tenants, "bob", "tenant-b") as bob:
        bob.management().declare_exchange(ExchangeSpecification(name="x2"))


def test_a_vhost_connection_limit_refuses_only_that_vhost(tenants: RunningServer) -> None:
    """tenant-a: max_connections = 2."""
    first = _proton(tenants, "alice", "tenant-a")
    second = _proton(tenants, "admin", "tenant-a")
    try:
        with RawClient.connect(
            tenants.host, tenants.port, plain=("alice", PASSWORD), hostname="vhost:tenant-a"
        ) as third:
            close = third.wait_for("close")
        assert close["error"]["condition"] == "amqp:resource-limit-exceeded"
        assert close["error"]["description"] == (
            "access to vhost 'tenant-a' refused for user 'alice': "
            "vhost connection limit (2) is reached"
        )
        other = _proton(tenants, "admin", "tenant-b")
        other.close()
    finally:
        first.close()
        second.close()
    # Closing gave the places back.
    _proton(tenants, "alice", "tenant-a").close()


def test_user_limits_on_connections_and_sessions(tenants: RunningServer) -> None:
    """carol: max_connections = 1, max_sessions = 2 (RabbitMQ's user limits)."""
    with RawClient.connect(
        tenants.host, tenants.port, plain=("carol", PASSWORD), hostname="vhost:tenant-b"
    ) as carol:
        with pytest.raises(ConnectionException, match="amqp:resource-limit-exceeded"):
            _proton(tenants, "carol", "tenant-b")
        carol.begin(0)
        carol.begin(1)
        carol.begin(2)
        end = carol.wait_for("end")
        assert end["error"]["condition"] == "amqp:resource-limit-exceeded"
        assert end["error"]["description"] == (
            "session refused for user 'carol': user session limit (2) is reached"
        )
        # Its other sessions carry on.
        attached = carol.wait_attach(carol.attach("ok", "sender", target="/queues/carol-q"))
        assert attached.error is None
    wait_until(lambda: tenants.call(lambda: len(tenants.server.broker.connections)) == 0)
    _proton(tenants, "carol", "tenant-b").close()


# -- durable state ---------------------------------------------------------------------------


def test_durable_queues_come_back_in_their_virtual_host(tmp_path: Path) -> None:
    """Same names in two virtual hosts, persistent messages, bindings: all back after a restart.

    A virtual host the log holds queues of must stay configured: without it the server refuses
    to start rather than drop its queues.
    """
    from integration.conftest import start_server

    running = start_server(data_dir=tmp_path, vhosts=_vhosts())
    try:
        for vhost, count in (("/", 1), ("tenant-a", 2), ("tenant-b", 3)):
            with ManagementClient(running.url, timeout=10, vhost=vhost) as management:
                assert management.request("PUT", "/queues/orders", {"durable": True}).ok
                assert management.request("PUT", "/exchanges/events", {"type": "fanout"}).ok
                bind = {"source": "events", "destination_queue": "orders", "binding_key": ""}
                assert management.request("POST", "/bindings", bind).ok
            persistent = [Message(body=b"x", durable=True)] * count
            connect = {"virtual_host": f"vhost:{vhost}"}
            published = publish(
                running.url, "/exchanges/events", messages=persistent, connect=connect
            )
            assert published.outcomes == ["accepted"] * count
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path, vhosts=_vhosts())
    try:
        for vhost, count in (("/", 1), ("tenant-a", 2), ("tenant-b", 3)):
            assert _ready(running, "orders", vhost) == count
            registry = running.server.tenancy.vhosts[vhost].registry
            bindings = running.call(functools.partial(registry.bindings, "events"))
            assert [b.destination for b in bindings] == ["orders"]
    finally:
        running.stop()
    with pytest.raises(VhostNotConfigured, match="virtual host 'tenant-a'"):
        start_server(data_dir=tmp_path)


def test_metrics_name_each_queues_virtual_host(tenants: RunningServer) -> None:
    # tenant-a may be at its queue limit (the quota tests share this server).
    for vhost in ("/", "tenant-b"):
        with _management(tenants, "admin", vhost) as management:
            assert management.request("PUT", "/queues/metered", {"durable": False}).ok
    with urllib.request.urlopen(tenants.metrics_url, timeout=30) as response:
        text = response.read().decode()
    ready = {
        sample.labels["vhost"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sluicegate_queue_messages_ready" and sample.labels["queue"] == "metered"
    }
    assert ready == {"/", "tenant-b"}
