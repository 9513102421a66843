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
from pathlib import Path
from typing import Any, Final

import proton
import pytest
from integration.conftest import RunningServer
from proton.utils import BlockingConnection, SendException
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


# -- deliveries no queue counts, asked for while the budget is blocked -----------------------

# Messages of the adversary's seed 65951: a batch of 256 of them is some 7.7 MB.
UNCOUNTED_BODY: Final = b"u" * 30_000
UNCOUNTED_MESSAGES: Final = 256
# What the consumers' sessions may hold once the budget is blocked: a connection asks for such
# deliveries only with nothing unsent, a quarter MiB by the largest it was handed
# (session/waiting.py ``IMPORT_BATCH``), so one request's worth and its deliveries' own cost.
UNCOUNTED_HELD: Final = 512 * KiB
_FIRST: Final = {
    "rabbitmq:stream-offset-spec": proton.Described(
        proton.symbol("rabbitmq:stream-offset-spec"), "first"
    )
}


def _fill_until_held(server: RunningServer, queue: str) -> int:
    """Publish 100 KB messages to ``queue``, which nobody reads, until the budget holds the
    publisher: how many were settled. Its connection stays, held, until the server stops."""
    connection = BlockingConnection(server.url, timeout=10)
    sender = connection.create_sender(f"/queues/{queue}")
    stored = 0
    while True:
        try:
            sender.send(proton.Message(body=b"f" * 100_000), timeout=3)
        except (proton.Timeout, SendException):
            assert server.call(lambda: server.server.broker.publishing.budget.blocked)
            return stored
        stored += 1


def _polite_publish(server: RunningServer, queue: str) -> bool:
    """Whether one small message to ``queue`` is accepted within a few seconds."""
    connection = BlockingConnection(server.url, timeout=10)
    sender = connection.create_sender(f"/queues/{queue}")
    try:
        sender.send(proton.Message(body=b"polite"), timeout=5)
    except (proton.Timeout, SendException):
        # Held: its close would not be read until the hold ends; its socket goes with the server.
        return False
    connection.close()
    return True


def _never_reads(server: RunningServer, source: str, links: int = 1, **attach: Any) -> RawClient:
    """A client with ``links`` consumers of ``source``, each granting credit for every message;
    it reads nothing once they have."""
    client = RawClient.connect(
        server.host, server.port, container_id="reads-nothing", rcvbuf=16 * KiB
    )
    client.begin(0)
    handles = [client.attach(f"u{n}", "receiver", source=source, **attach) for n in range(links)]
    for handle in handles:
        assert client.wait_attach(handle).error is None
    for handle in handles:
        client.flow(handle, link_credit=10_000)
    return client


def _settled_waiting(server: RunningServer) -> int:
    """What waits in every session once it stops moving."""
    broker = server.server.broker
    last = -1
    while (now := server.call(lambda: broker.waiting.total)) != last:
        last = now
        time.sleep(0.5)
    return int(now)


def _assert_blocked_budget_holds(server: RunningServer, client: RawClient) -> None:
    """With the budget blocked, the consumer's deliveries (bytes no queue counts) take the
    publishers' level no further than their ceiling, and a polite publisher is served."""
    broker = server.server.broker
    budget = broker.publishing.budget
    _settled_waiting(server)
    level, ceiling, peak = server.call(
        lambda: (budget.publishing_level(budget.current), budget.publishing_ceiling, budget.peak)
    )
    waiting = server.call(lambda: _waiting(server, "reads-nothing"))
    assert waiting is not None
    # Before: megabytes of them waited in its session, counted in full, in one pass: the
    # publishers' level went past their ceiling, the count past the budget's, and every
    # publisher waited.
    assert waiting.bytes <= UNCOUNTED_HELD, f"{waiting.bytes} bytes waiting in the session"
    assert level < ceiling, f"publishers' level {level} past their ceiling {ceiling}"
    assert peak <= budget.ceiling, f"the count reached {peak}, past {budget.ceiling}"
    assert server.call(lambda: budget.blocked)
    assert _polite_publish(server, "polite")
    client.reset()
    wait_until(lambda: server.call(lambda: broker.waiting.total) == 0)


def test_stream_readers_that_never_read_take_a_blocked_budget_no_further(
    make_server: Callable[..., RunningServer],
) -> None:
    """A stream's readers get a take of bodies read for each (queues/log/stream_entries.py),
    bytes no queue counts: while the budget is blocked by a queue nobody reads, 64 readers
    granting 10,000 credit on one socket never read ask their stream only as another worker's
    consumers ask (session/waiting.py), a batch sized in bytes, with nothing unsent on their
    connection. Before, their takes filled the connection's 8 MiB, the publishers' level
    6.6 MB past their ceiling."""
    server = make_server(memory_budget=16 * MiB, writer_buffer_size=256 * KiB)
    server.call(
        lambda: server.server.registry.declare_queue("read-late", {"x-queue-type": "stream"})
    )
    published = publish(server.url, "/queues/read-late", [UNCOUNTED_BODY] * UNCOUNTED_MESSAGES)
    assert published.outcomes == ["accepted"] * UNCOUNTED_MESSAGES
    assert _fill_until_held(server, "blocks") > 0
    client = _never_reads(server, "/queues/read-late", 64, filters=_FIRST)
    _assert_blocked_budget_holds(server, client)


def test_a_presettled_durable_consumer_that_never_reads_takes_a_blocked_budget_no_further(
    make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A durable queue hands a pre-settled consumer its logged messages with their bodies read
    for it, bytes no queue counts: while the budget is blocked, one that never reads asks as
    a stream's reader does above (before: 5 MB waited in its session, the publishers' level
    11 MB past their ceiling)."""
    first = make_server(data_dir=tmp_path)
    first.call(lambda: first.server.registry.declare_queue("kept", durable=True))
    durable = [proton.Message(body=UNCOUNTED_BODY, durable=True)] * UNCOUNTED_MESSAGES
    published = publish(first.url, "/queues/kept", messages=durable)
    assert published.outcomes == ["accepted"] * UNCOUNTED_MESSAGES
    first.stop()
    # Recovered, each message is a log position whose body is read only as it is handed out.
    server = make_server(data_dir=tmp_path, memory_budget=16 * MiB, writer_buffer_size=256 * KiB)
    assert _fill_until_held(server, "blocks") > 0
    client = _never_reads(server, "/queues/kept", snd_settle_mode="settled")
    _assert_blocked_budget_holds(server, client)
    # Those it was sent left the held bytes with their queue, the rest went back: once the
    # queues it touched are purged, the held bytes are the filling queue's messages alone
    # (each body sent stayed counted for good, taken as a holder of a payload nothing let go).
    assert server.queue("kept").delivered > 0
    registry = server.server.broker.registry

    def unaccounted() -> int:
        registry.purge_queue("kept")
        registry.purge_queue("polite")
        blocks = registry.queue("blocks").statistics()
        return registry.held.total - blocks.ready_bytes - blocks.ready * MESSAGE_OVERHEAD

    assert server.call(unaccounted) == 0


def test_credit_granted_before_the_budget_blocked_brings_no_uncounted_batch_past_it(
    make_server: Callable[..., RunningServer],
) -> None:
    """Seed 65951's kind: a pre-settled consumer of a durable queue grants 10,000 credit while
    another consumer holds every message unsettled, so its queue keeps a batch of credit for
    it; the budget blocks, and the other consumer's connection drops, its 256 messages of
    30 KB back in the queue. Handed to the pre-settled one at once, 5 MB of their bodies
    waited in its session in one pass, the publishers' level 3 MB past their ceiling; the
    budget's blocking now takes that credit back, and the consumer asks again as above."""
    server = make_server(memory_budget=16 * MiB, writer_buffer_size=256 * KiB)
    server.call(lambda: server.server.registry.declare_queue("returned", durable=True))
    durable = [proton.Message(body=UNCOUNTED_BODY, durable=True)] * UNCOUNTED_MESSAGES
    published = publish(server.url, "/queues/returned", messages=durable)
    assert published.outcomes == ["accepted"] * UNCOUNTED_MESSAGES
    with RawClient.connect(server.host, server.port, container_id="takes-all") as taker:
        taker.begin(0)
        handle = taker.attach("taker", "receiver", source="/queues/returned")
        assert taker.wait_attach(handle).error is None
        taker.flow(handle, link_credit=UNCOUNTED_MESSAGES)
        for _ in range(UNCOUNTED_MESSAGES):
            assert taker.next_message(timeout=30) is not None
        client = _never_reads(server, "/queues/returned", snd_settle_mode="settled")
        wait_until(lambda: _settled_waiting(server) == 0)
        assert _fill_until_held(server, "blocks") > 0
        taker.reset()
    _assert_blocked_budget_holds(server, client)
