"""Queue TTL (``x-expires``) over a real server: RabbitMQ's client declares, proton consumes.

A queue unused for its x-expires is deleted with its messages and bindings; an attached
consumer keeps it, publishing does not; links still attached are detached with
``amqp:resource-deleted``. Timings are polled with generous deadlines: the server only
promises a queue goes *after* its x-expires, never how soon.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from integration.conftest import RunningServer, start_server
from proton import Message
from proton.reactor import Copy
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender, LinkDetached
from rabbitmq_amqp_python_client import (
    AddressHelper,
    ClassicQueueSpecification,
    Connection,
    Environment,
    Management,
    ValidationCodeException,
)
from support.clients import publish
from support.polling import wait_until

# Short enough for a quick test; the queue is held by a consumer whenever a test needs it to
# outlive a client's round trip, so a slow machine cannot expire it early.
EXPIRES = timedelta(milliseconds=300)
# How long a deletion may take on a loaded machine before the test gives up.
GONE_WITHIN = 30.0


@pytest.fixture
def management(server: RunningServer) -> Iterator[Management]:
    environment = Environment(f"amqp://127.0.0.1:{server.port}/")
    connection: Connection = environment.connection()
    connection.dial()
    management = connection.management()
    yield management
    management.close()
    connection.close()
    environment.close()


def _exists(server: RunningServer, name: str) -> bool:
    return server.call(lambda: server.server.registry.get(name)) is not None


def _expires(server: RunningServer, name: str) -> int | None:
    registry = server.server.registry
    return server.call(lambda: registry.settings(name).arguments.expires)


def _declare_held(
    server: RunningServer, management: Management, connection: BlockingConnection, name: str
) -> BlockingReceiver:
    """Declare ``name`` with x-expires and attach a browser that holds it in use.

    Attaching to a queue that is gone declares it again with defaults; if the machine was slow
    enough for the new queue to expire before the browser attached, start again.
    """
    spec = ClassicQueueSpecification(name=name, auto_expires=EXPIRES)
    for _ in range(5):
        management.declare_queue(spec)
        browser = connection.create_receiver(
            AddressHelper.queue_address(name), name=f"{name}-browser", options=Copy()
        )
        if _expires(server, name) == EXPIRES // timedelta(milliseconds=1):
            return browser
        browser.close()  # type: ignore[no-untyped-call]
        management.delete_queue(name)
    pytest.fail(f"queue {name!r} expired before a consumer could attach, five times")


def _publish_until_detached(sender: BlockingSender) -> LinkDetached:
    """Publish every 50 ms, well within x-expires, until the server detaches the link."""
    deadline = time.monotonic() + GONE_WITHIN
    while time.monotonic() < deadline:
        try:
            sender.send(Message(body="more"), timeout=GONE_WITHIN)
        except LinkDetached as detached:
            return detached
        time.sleep(0.05)
    pytest.fail("the publisher of the expired queue was not detached")


def test_an_unused_queue_goes_with_its_messages_and_its_publisher_is_detached(
    server: RunningServer, management: Management
) -> None:
    """Publishing is not use: the queue goes while a publisher keeps sending to it."""
    name = "expiry-unused"
    connection = BlockingConnection(server.url)
    try:
        browser = _declare_held(server, management, connection, name)
        sender = connection.create_sender(AddressHelper.queue_address(name))
        for index in range(5):
            sender.send(Message(body=f"m{index}"))
        assert server.queue(name).ready == 5
        assert management.queue_info(name).arguments["x-expires"] == 300
        browser.close()  # type: ignore[no-untyped-call]
        detached = _publish_until_detached(sender)
        assert detached.condition == "amqp:resource-deleted"
        assert not _exists(server, name)
        with pytest.raises(ValidationCodeException, match="404"):
            management.queue_info(name)
    finally:
        connection.close()


def test_an_attached_consumer_keeps_the_queue_and_its_detach_starts_the_countdown(
    server: RunningServer, management: Management
) -> None:
    name = "expiry-consumed"
    connection = BlockingConnection(server.url)
    try:
        browser = _declare_held(server, management, connection, name)
        consumer = connection.create_receiver(
            AddressHelper.queue_address(name), credit=10, name=f"{name}-consumer"
        )
        wait_until(lambda: server.queue(name).consumers == 2)
        # Several times its x-expires, with consumers attached: it stays.
        time.sleep(4 * EXPIRES.total_seconds())
        assert _expires(server, name) == 300
        browser.close()  # type: ignore[no-untyped-call]
        time.sleep(2 * EXPIRES.total_seconds())
        assert server.queue(name).consumers == 1
        consumer.close()  # type: ignore[no-untyped-call]
        wait_until(lambda: not _exists(server, name), timeout=GONE_WITHIN)
    finally:
        connection.close()


def test_a_queue_with_bindings_loses_them_when_it_expires(
    server: RunningServer, management: Management
) -> None:
    name = "expiry-bound"
    registry = server.server.registry
    server.call(lambda: registry.declare_exchange("expiry-events", "fanout"))
    connection = BlockingConnection(server.url)
    try:
        browser = _declare_held(server, management, connection, name)
        server.call(lambda: registry.bind("expiry-events", name))
        published = publish(server.url, "/exchanges/expiry-events", ["routed"])
        assert published.outcomes == ["accepted"]
        browser.close()  # type: ignore[no-untyped-call]
        wait_until(lambda: not _exists(server, name), timeout=GONE_WITHIN)
        assert server.call(lambda: registry.bindings(source="expiry-events")) == []
        # The exchange no longer routes to the queue, and does not declare it again.
        assert publish(server.url, "/exchanges/expiry-events", ["lost"]).outcomes == ["released"]
        assert not _exists(server, name)
    finally:
        connection.close()


@pytest.mark.parametrize("expires", [timedelta(0), timedelta(milliseconds=-5)])
def test_x_expires_must_be_positive(management: Management, expires: timedelta) -> None:
    spec = ClassicQueueSpecification(name="expiry-bad", auto_expires=expires)
    with pytest.raises(ValidationCodeException, match="ErrPreconditionFailed"):
        management.declare_queue(spec)


@pytest.mark.slow
def test_a_durable_queue_expires_after_a_restart_and_its_deletion_is_logged(
    tmp_path: Path,
) -> None:
    """After a restart the countdown starts again from the server's start, as in RabbitMQ."""
    lasting = 4_000
    running = start_server(data_dir=tmp_path)
    registry = running.server.registry

    def declare() -> None:
        registry.declare_queue("expiry-short", {"x-expires": 300})
        registry.declare_queue("expiry-long", {"x-expires": lasting})
        registry.declare_queue("expiry-kept")

    declared = time.monotonic()
    running.call(declare)
    for address in ("/queues/expiry-long", "/queues/expiry-kept"):
        messages = [Message(body=f"m{i}", durable=True) for i in range(3)]
        assert publish(running.url, address, messages=messages).outcomes == ["accepted"] * 3
    wait_until(lambda: not _exists(running, "expiry-short"), timeout=GONE_WITHIN)
    running.stop()
    # Stopped for longer than expiry-long's x-expires since its declaration.
    time.sleep(max(0.0, declared + lasting / 1000 + 0.5 - time.monotonic()))
    running = start_server(data_dir=tmp_path)
    try:
        assert not _exists(running, "expiry-short")
        # Its countdown started again with the server: it is still there, messages and all.
        assert running.queue("expiry-long").ready == 3
        wait_until(lambda: not _exists(running, "expiry-long"), timeout=GONE_WITHIN)
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        assert not _exists(running, "expiry-long")
        assert running.queue("expiry-kept").ready == 3
    finally:
        running.stop()
