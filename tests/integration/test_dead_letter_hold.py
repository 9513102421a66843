"""A consumer's dead-letter fan-out holds its own deliveries, and no one else's (issue 31).

A consumer rejects the messages of three queues that dead-letter into a fanout bound to all
three: each rejection makes three copies, until the memory budget has no room and the letters
wait. Their copies are charged to the consumer's links, against its connection's dead-letter
debt (session/dead_letter_debt.py): at the limit its links get no new deliveries, while its
socket is still read. It keeps some deliveries unsettled (its hoard), which hold part of the
budget, as the consumer of the reverted attempt did (c8603bc): that attempt paused the
consumer's reads, so the settlements that would free the budget never arrived and it never
resumed. Here the hoard's settlements arrive, the letters are stored, the debt is repaid and
the consumer gets deliveries again; a prober publishing and consuming on its own queue is
served all along. Before, the consumer was charged nothing: it went on taking and rejecting
messages as long as any was ready.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import ConnectionException, Delivery, Event, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.prober import Prober

from sluicegate.gateway.events import delivery_of

QUEUES: Final = ("dh-q1", "dh-q2", "dh-q3")
# The rejecter's prefetch on each of its links: the most its queue holds credit for, or its
# session holds for it, when the hold begins (what it may still get once held), and the most it
# holds unsettled beyond its hoard (what it may still reject).
PREFETCH: Final = 20
# The deliveries it keeps unsettled until told: their bytes (2.6 MB of 4 KB messages) take the
# 8 MiB budget, once settled, below the 80 % where it has room again, room enough for the
# letters that repay the debt (at most LIMIT + 2 * PREFETCH per link + 3, some 80 letters of
# 9 KB of copies each).
HOARD: Final = 600
# The connection's dead-letter debt limit (account_limit): small, so that the debt stays small
# enough for the hoard's room to repay it; the default (400) is the same mechanism.
LIMIT: Final = 20
BODY: Final = "x" * 4_000
# A served prober's round takes well under a second, even on a loaded machine.
SERVED: Final = 5.0


class _Hoarder(MessagingHandler):
    """Keeps its first :data:`HOARD` deliveries unsettled and rejects every other one; settles
    the hoard (accepted) once :attr:`settling` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(prefetch=PREFETCH, auto_accept=False)
        self.url = url
        self.received = 0
        self.rejected = 0
        self.hoard: list[Delivery] = []
        self.settling = threading.Event()
        self.stopping = threading.Event()

    def on_start(self, event: Event) -> None:
        connection = event.container.connect(self.url)
        for queue in QUEUES:
            event.container.create_receiver(connection, f"/queues/{queue}")
        event.container.schedule(0.05, self)

    def on_timer_task(self, event: Event) -> None:
        if self.stopping.is_set():
            event.container.stop()
            return
        if self.settling.is_set():
            for delivery in self.hoard:
                self.accept(delivery)
            self.hoard.clear()
        event.container.schedule(0.05, self)

    def on_message(self, event: Event) -> None:
        self.received += 1
        if len(self.hoard) < HOARD and not self.settling.is_set():
            self.hoard.append(delivery_of(event))
            return
        self.reject(delivery_of(event))
        self.rejected += 1


@pytest.mark.alone  # bounds a latency: docs/testing.md
@pytest.mark.slow
def test_a_consumers_dead_letter_fan_out_holds_its_deliveries_until_its_letters_are_stored(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=8 * 1024 * 1024, account_limit=LIMIT)
    server = running.server
    registry = server.registry
    router = registry.dead_letter_router

    def declare() -> None:
        registry.declare_exchange("dh-fan", "fanout")
        for name in QUEUES:
            registry.declare_queue(name, {"x-dead-letter-exchange": "dh-fan"})
            registry.bind("dh-fan", name)

    def debts() -> list[tuple[int, bool, bool]]:
        """Each open connection's (dead-letter debt, held, reads paused)."""
        return [(c.letters.debt, c.letters.held, c.reads_paused) for c in server.broker.connections]

    running.call(declare)
    hoarder = _Hoarder(running.url)
    thread = threading.Thread(target=Container(hoarder).run, daemon=True)
    samples: list[list[tuple[int, bool, bool]]] = []
    # The attack's publisher stays attached: a publisher that is alone while the budget is
    # exhausted is held by any message in its queue (docs/inbound-flow-control.md weighs it
    # against the mean of the publishing links), which would hold the prober.
    publisher = BlockingConnection(running.url, timeout=10)
    try:
        with Prober(running.url, "/queues/dh-prober") as prober:
            thread.start()
            try:
                sender = publisher.create_sender(f"/queues/{QUEUES[0]}")
                for _ in range(HOARD + 1):
                    sender.send(Message(body=BODY))
                # The copies fill the budget, the letters wait, and their debt holds the
                # rejecter.
                wait_until(lambda: any(held for _, held, _ in running.call(debts)), 60)
                received = hoarder.received
                # Held, it gets at most what its queues and session held for it already.
                time.sleep(1)
                samples.append(running.call(debts))
                after = hoarder.received
                time.sleep(1)
                samples.append(running.call(debts))
                stopped = hoarder.received
                rounds = len(prober.seen.rounds)
                prober.wait_rounds(rounds + 3, timeout=30)
                letters = running.call(lambda: len(router.outbox))
                # Its hoard settled, the budget has room: the letters are stored, the debt
                # repaid, and the rejecter is served again.
                hoarder.settling.set()
                wait_until(lambda: hoarder.received > stopped, 30)
            finally:
                hoarder.stopping.set()
                thread.join(10)
    finally:
        # The budget may hold the publisher unread, its CLOSE with it: the server goes first,
        # and the close is not waited for.
        running.stop()
        publisher.timeout = 0.1
        with contextlib.suppress(ConnectionException, Timeout):
            publisher.close()
    seen = prober.seen
    assert seen.failures == []
    assert seen.worst < SERVED
    # Exactly one connection is held, and its reads are not paused.
    for sample in samples:
        assert [held for _, held, _ in sample].count(True) == 1
        assert not any(paused for _, held, paused in sample if held)
    assert after - received <= PREFETCH * len(QUEUES)
    assert stopped == after, "a held consumer was handed new deliveries"
    assert letters > 0
    # Its debt passes the limit by what it held unsettled and was handed once held, at most.
    debt = max(debt for sample in samples for debt, held, _ in sample if held)
    assert LIMIT <= debt <= LIMIT + 2 * PREFETCH * len(QUEUES) + len(QUEUES)
