"""What a consumer makes the server hold is counted once in the memory budget (issue 31).

The adversary's seed 3007 (docs/adversary.md) ended with a consumer granting 10,000 credit on a
queue of large messages and never reading: the deliveries waiting in its session were counted
in the budget on top of the queue's own count of the same unacked messages, the count went past
the budget's ceiling, and every publisher on the server, the prober's included, was held for as
long as that consumer stayed. The bytes a connection holds waiting are still charged to it in
full, for its own limit (``max_outgoing_pending_size``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from support.clients import publish
from support.flood import Flood, SlowConsumer
from support.polling import wait_until
from support.prober import ROUND_TIMEOUT, Prober
from support.raw_client import RawClient

from sluicegate.gateway.state import ConnectionState
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.session.waiting import WaitingStatistics

KiB: Final = 1024
MiB: Final = 1024 * KiB


def _waiting(server: RunningServer, name: str) -> WaitingStatistics | None:
    for state in server.server.broker.connections:
        assert isinstance(state, ConnectionState)
        if state.connection.remote_container == name:
            return state.waiting.statistics()
    return None


def test_a_consumer_that_never_reads_a_full_queue_holds_no_other_publisher(
    make_server: Callable[..., RunningServer],
) -> None:
    """A queue holding 14 of a 16 MiB budget, and a consumer taking its messages with 10,000
    credit on a socket it never reads: a batch of them waits in its session, charged to it in
    full, while the budget's count grows only by what the deliveries cost beyond the messages
    the queue counts already, so it stays under the limit (it went to 27 MiB, past the 18 MiB
    ceiling) and a prober publishing to another queue goes on being served."""
    budget = 16 * MiB
    server = make_server(memory_budget=budget, writer_buffer_size=256 * KiB)
    body = b"f" * (60 * KiB)
    count = 230  # one queue credit batch (256) takes them all
    assert publish(server.url, "/queues/full", [body] * count).outcomes == ["accepted"] * count
    broker = server.server.broker

    def counted() -> int:
        return int(server.call(lambda: broker.registry.held.total + broker.outbound_bytes()))

    assert counted() >= count * (len(body) + MESSAGE_OVERHEAD)
    with Prober(server.url, "/queues/probe-full") as prober:
        prober.wait_rounds(1, timeout=30)
        client = RawClient.connect(
            server.host, server.port, container_id="never-reads", rcvbuf=16 * KiB
        )
        with client:
            client.begin(0)
            handle = client.attach("takes-all", "receiver", source="/queues/full")
            assert client.wait_attach(handle).error is None
            client.flow(handle, link_credit=10_000)
            # From now on nothing is read: what the writer cannot take waits in the session.
            # Most of them (the writer's 256 KiB and the sockets' buffers took some).
            taken = count * len(body) * 3 // 4

            def waiting() -> int:
                held = server.call(lambda: _waiting(server, "never-reads"))
                return 0 if held is None else held.bytes

            wait_until(lambda: waiting() >= taken, timeout=30)
            # Counted once: the queue's messages, their deliveries' own cost, the writer.
            assert counted() < budget
            assert not server.call(lambda: broker.publishing.budget.blocked)
            mark = len(prober.seen.rounds)
            wait_until(lambda: len(prober.seen.rounds) >= mark + 5, timeout=30)
            client.reset()
    seen = prober.seen
    assert seen.failures == []
    assert seen.worst < ROUND_TIMEOUT
    # Nothing of the consumer is counted once it is gone; its messages are back in the queue.
    wait_until(lambda: server.call(broker.outbound_bytes) == 0)
    stats = server.call(lambda: broker.registry.queue("full").statistics())
    assert (stats.ready, stats.unacked, stats.consumers) == (count, 0, 0)


@pytest.mark.slow
def test_a_publisher_feeding_a_consumer_that_never_settles_is_held_others_publish_on(
    make_server: Callable[..., RunningServer],
) -> None:
    # The hoarder takes every message as it comes and settles none: its queue has nothing
    # ready, so its publisher was weighed at nothing, never held at the budget, and went on
    # through the margin meant for others up to the ceiling, where every publisher waits: the
    # prober was held for as long as the hoarder stayed. The bytes a queue's consumers hold
    # unsettled now weigh its publishers as its ready ones do (docs/inbound-flow-control.md).
    budget = 8 * MiB
    running = make_server(memory_budget=budget)
    memory = running.server.broker.publishing.budget
    hoarder = SlowConsumer(running.url, "/queues/hoarded", 300 * KiB, 100_000, None, settles=False)
    flood = Flood(running.url, ["/queues/hoarded"], body_size=300 * KiB)
    hoarder.start()
    flood.start()
    try:
        wait_until(lambda: running.call(lambda: memory.blocked), 60)
        sent = -1
        while sent != flood.sent:
            sent = flood.sent
            time.sleep(1.0)
        with Prober(running.url) as prober:
            prober.wait_rounds(5, timeout=60)
        used = running.call(lambda: memory.current)
        hoarded = len(hoarder.received)
    finally:
        flood.stopping.set()
        hoarder.stop()
    assert hoarded > 0
    assert prober.seen.failures == []
    assert len(prober.seen.rounds) >= 5
    assert used <= memory.ceiling
