"""Direct Reply-To as RabbitMQ 4.2 serves it over AMQP 1.0, driven by proton's own client.

A requester's receiving link has a dynamic source asking for ``rabbitmq:volatile-queue``; the
server answers with ``/queues/amq.rabbitmq.reply-to.<random>``. Replies published there reach
the requester while its link has credit and are dropped otherwise; only that link consumes
them, and the address is gone once it detaches. (RabbitMQ's own client and rhea drive the
same feature in test_rabbitmq_client.py and test_rhea.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Array, Data, Link, Message, Terminus, symbol
from proton.reactor import AtMostOnce, ReceiverOption
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached
from support.polling import wait_until
from support.prober import ROUND_TIMEOUT, probe_once

VOLATILE = symbol("rabbitmq:volatile-queue")
KiB: Final = 1024
MiB: Final = 1024 * KiB


class ReplyTo(ReceiverOption):
    """The source RabbitMQ's clients ask for: dynamic, volatile, durability none, link-detach."""

    def __init__(self, capabilities: list[symbol] | None = None) -> None:
        self.capabilities = [VOLATILE] if capabilities is None else capabilities

    def apply(self, receiver: Link) -> None:
        source = receiver.source
        source.expiry_policy = Terminus.EXPIRE_WITH_LINK
        source.durability = Terminus.NONDURABLE
        source.timeout = 0
        if self.capabilities:
            source.capabilities.put_object(Array(Data.NULL, Data.SYMBOL, *self.capabilities))


@pytest.fixture
def connection(server: RunningServer) -> Iterator[BlockingConnection]:
    opened = BlockingConnection(server.url, timeout=30)
    yield opened
    opened.close()


def requester(connection: BlockingConnection, credit: int) -> tuple[BlockingReceiver, str]:
    receiver = connection.create_receiver(
        None, credit=credit, dynamic=True, options=[AtMostOnce(), ReplyTo()]
    )
    address = receiver.link.remote_source.address
    assert address is not None
    return receiver, address


def test_the_server_names_the_reply_address_and_echoes_the_source(
    connection: BlockingConnection,
) -> None:
    receiver, address = requester(connection, credit=10)
    assert address.startswith("/queues/amq.rabbitmq.reply-to.")
    source = receiver.link.remote_source
    assert source.dynamic
    assert source.distribution_mode == Terminus.DIST_MODE_MOVE
    source.capabilities.rewind()
    source.capabilities.next()
    assert list(source.capabilities.get_object().elements) == [VOLATILE]
    # Each requester gets its own, unguessable address.
    _, other = requester(connection, credit=10)
    assert other != address
    assert len(other) > len("/queues/amq.rabbitmq.reply-to.") + 20


def test_replies_reach_the_requester_and_are_dropped_without_credit(
    connection: BlockingConnection, server: RunningServer
) -> None:
    receiver, address = requester(connection, credit=2)
    name = address.removeprefix("/queues/")
    responder = BlockingConnection(server.url, timeout=30)
    try:
        anonymous = responder.create_sender(None)
        for index in range(5):
            # A reply goes to the request's reply-to: the null target with that ``to``.
            anonymous.send(Message(address=address, correlation_id=index, body=f"r{index}"))
        assert [receiver.receive(timeout=10).body for _ in range(2)] == ["r0", "r1"]
        stats = server.queue(name)
        assert (stats.published, stats.delivered, stats.dropped) == (5, 2, 3)
        # Credit again: the next replies arrive; what was dropped is gone for good.
        receiver.flow(1)
        direct = responder.create_sender(address)
        direct.send(Message(body="r5"))
        assert receiver.receive(timeout=10).body == "r5"
    finally:
        responder.close()


def test_only_the_requesters_link_consumes_and_the_address_goes_with_it(
    connection: BlockingConnection, server: RunningServer
) -> None:
    receiver, address = requester(connection, credit=1)
    name = address.removeprefix("/queues/")
    other = BlockingConnection(server.url, timeout=30)
    try:
        with pytest.raises(LinkDetached, match="precondition-failed"):
            other.create_receiver(address)
        receiver.close()  # type: ignore[no-untyped-call]
        wait_until(lambda: server.call(lambda: server.server.registry.get(name)) is None)
        with pytest.raises(LinkDetached, match="not-found"):
            other.create_sender(address)
    finally:
        other.close()


@pytest.mark.parametrize(
    ("capabilities", "options"),
    [
        ([], [AtMostOnce()]),
        ([symbol("temporary-topic")], [AtMostOnce()]),
        # Replies are pre-settled: a requester asking to settle them is refused.
        ([VOLATILE], []),
    ],
    ids=["no-capability", "other-capability", "unsettled"],
)
def test_other_dynamic_sources_are_not_implemented(
    connection: BlockingConnection, capabilities: list[symbol], options: list[ReceiverOption]
) -> None:
    with pytest.raises(LinkDetached, match="not-implemented"):
        connection.create_receiver(None, dynamic=True, options=[*options, ReplyTo(capabilities)])
    # The connection carries on.
    requester(connection, credit=1)


def test_a_requester_that_never_reads_holds_its_waiting_limit_and_no_one_else_waits(
    make_server: Callable[..., RunningServer],
) -> None:
    """Issue 31: a requester granting much credit and never reading had every reply wait in its
    session, a batch of 256 at a time: with large replies it held the whole memory budget and
    every publisher of the server waited. Its replies are now dropped once its connection's
    waiting deliveries reach ``max_outgoing_pending_size``, as RabbitMQ drops the replies its
    writer cannot send; the responder and everyone else go on."""
    limit = 2 * MiB
    reply = b"r" * (256 * KiB)
    running = make_server(memory_budget=16 * MiB, max_outgoing_pending_size=limit)
    greedy = BlockingConnection(running.url, timeout=30)
    responder = BlockingConnection(running.url, timeout=30)
    try:
        _, address = requester(greedy, credit=100_000)
        sender = responder.create_sender(address)
        sent = 120  # 30 MiB of replies: far beyond the budget
        for _ in range(sent):
            sender.send(Message(body=reply), timeout=30)

        def held() -> tuple[int, int]:
            broker = running.server.broker
            waiting = max(state.waiting.bytes for state in broker.connections)
            return waiting, broker.publishing.budget.statistics().blocks

        waiting, blocks = running.call(held)
        # Its limit and one reply (the one that crossed it), with the reply's bookkeeping.
        assert waiting <= limit + len(reply) + 4 * KiB
        assert blocks == 0
        stats = running.queue(address.removeprefix("/queues/"))
        assert stats.published == sent
        assert stats.dropped >= sent - (limit + len(reply)) // len(reply) - 2 * 16
        # Everyone else is served: a publisher and consumer, and another requester.
        assert probe_once(running.url, "/queues/drt-prober") < ROUND_TIMEOUT
        other = BlockingConnection(running.url, timeout=30)
        try:
            receiver, other_address = requester(other, credit=1)
            responder.create_sender(other_address).send(Message(body="served"), timeout=30)
            assert receiver.receive(timeout=30).body == "served"
        finally:
            other.close()
    finally:
        responder.close()
        greedy.close()
