"""Credit granted with a consumer's ATTACH waits for the client's next frame
(gateway/rules/credit_hold.py, docs/outbound-flow-control.md).

RabbitMQ's Python client opens a consumer through proton's blocking receiver, whose handler
grants credit in the same write as the ATTACH; when the first message reached the client in the
same read as the ATTACH reply, the handler ran inside the call that opens the link (its suite's
test of invalid annotations then broke every later test). The servers here hold that credit for
a minute unless told otherwise, so only the client's next frame can release it and no test
depends on how fast this machine is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from integration.conftest import RunningServer, start_server
from proton import Event
from proton.handlers import MessagingHandler
from proton.utils import BlockingConnection
from support.clients import publish
from support.raw_client import RawClient

# Longer than any test here takes: credit held this long is released by a frame or not at all.
LONG_HOLD = 60.0
# A silent period long enough to see a transfer that was on its way, not a speed requirement.
QUIET_S = 0.3
# Links opened one after another on one connection: each is a chance for the first message to
# share a read with its ATTACH reply (RabbitMQ's client did in about 1 of 7 when it could).
ROUNDS = 20


@pytest.fixture(scope="module")
def holding() -> Iterator[RunningServer]:
    running = start_server(attach_credit_hold=LONG_HOLD)
    yield running
    running.stop()


def filled(server: RunningServer, count: int) -> str:
    queue = f"hold-{uuid.uuid4().hex[:10]}"
    bodies = [f"m{i}" for i in range(count)]
    assert publish(server.url, queue, bodies).outcomes == ["accepted"] * count
    return queue


class _Handler(MessagingHandler):
    """What RabbitMQ's Python client's consumer handler is: it grants 10 credit as the link
    opens. It settles nothing (the link's close gives its messages back) and counts the
    messages that came while the link was still being opened."""

    def __init__(self) -> None:
        super().__init__(prefetch=10, auto_accept=False)
        self.opening = True
        self.early = 0
        self.received = 0

    def on_message(self, event: Event) -> None:
        self.early += self.opening
        self.received += 1


def _open_and_take_one(connection: BlockingConnection, queue: str) -> int:
    """Open a consumer as RabbitMQ's Python client does, wait for a message, close it; the
    messages that reached the handler before the link was open."""
    handler = _Handler()
    receiver = connection.create_receiver(queue, credit=10, handler=handler)
    handler.opening = False
    connection.wait(lambda: handler.received > 0, timeout=10)
    receiver.close()  # type: ignore[no-untyped-call]
    return handler.early


def test_a_blocking_receivers_handler_never_runs_inside_the_call_that_opens_it(
    holding: RunningServer,
) -> None:
    queue = filled(holding, 1)
    connection = BlockingConnection(holding.url)
    try:
        early = [_open_and_take_one(connection, queue) for _ in range(ROUNDS)]
    finally:
        connection.close()
    assert early == [0] * ROUNDS


def test_credit_sent_with_the_attach_waits_for_the_clients_next_frame(
    holding: RunningServer,
) -> None:
    queue = filled(holding, 3)
    client = RawClient.connect(holding.host, holding.port)
    try:
        client.begin()
        with client.corked():
            handle = client.attach("early", "receiver", source=queue, snd_settle_mode="settled")
            client.flow(handle, link_credit=10)
        client.wait_attach(handle)
        silent = client.expect_nothing(QUIET_S)
        assert [frame.performative for frame in silent] == []
        # proton's blocking receiver grants its credit again once the link is open.
        client.flow(handle, link_credit=20)
        assert all(client.next_message() is not None for _ in range(3))
    finally:
        client.abort()


def test_credit_sent_after_the_attach_reply_counts_at_once(holding: RunningServer) -> None:
    queue = filled(holding, 1)
    client = RawClient.connect(holding.host, holding.port)
    try:
        client.begin()
        handle = client.attach("late", "receiver", source=queue, snd_settle_mode="settled")
        client.wait_attach(handle)
        client.flow(handle, link_credit=10)
        assert client.next_message() is not None
    finally:
        client.abort()


def test_a_client_that_says_nothing_more_gets_its_messages_when_the_hold_ends(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(attach_credit_hold=0.1)
    queue = filled(server, 2)
    client = RawClient.connect(server.host, server.port)
    try:
        client.begin()
        with client.corked():
            handle = client.attach("silent", "receiver", source=queue, snd_settle_mode="settled")
            client.flow(handle, link_credit=10)
        assert client.next_message() is not None
        assert client.next_message() is not None
    finally:
        client.abort()


def test_many_links_held_at_once_all_get_their_messages_and_nothing_stays_held(
    make_server: Callable[..., RunningServer],
) -> None:
    """The attack: a session full of consumers granting credit with their ATTACHes, and a
    client that then says nothing. Each waits at most the hold, all at once."""
    server = make_server(attach_credit_hold=0.1)
    links = 250  # within max_links_per_session (256), beside nothing else
    queue = filled(server, links)
    client = RawClient.connect(server.host, server.port)
    try:
        client.begin()
        with client.corked():
            for index in range(links):
                handle = client.attach(
                    f"held-{index}", "receiver", source=queue, snd_settle_mode="settled"
                )
                client.flow(handle, link_credit=1)
        assert all(client.next_message() is not None for _ in range(links))

        def held() -> list[bool]:
            return [bool(c.credit_hold) for c in server.server.broker.connections]

        assert server.call(held) == [False]
    finally:
        client.abort()


def test_a_direct_reply_to_requesters_early_credit_is_not_held(holding: RunningServer) -> None:
    """A dynamic source's queue is empty and named to no one before the reply: nothing to hold,
    and a Direct Reply-To queue drops a reply that finds no credit."""
    client = RawClient.connect(holding.host, holding.port)
    try:
        client.begin()
        with client.corked():
            handle = client.attach(
                "requester",
                "receiver",
                dynamic=True,
                snd_settle_mode="settled",
                capabilities=["rabbitmq:volatile-queue"],
                expiry_policy="link-detach",
            )
            client.flow(handle, link_credit=10)
        address = client.wait_attach(handle).source_address
        assert address is not None
        assert publish(holding.url, address, ["reply"]).outcomes == ["accepted"]
        assert client.next_message() is not None
    finally:
        client.abort()
