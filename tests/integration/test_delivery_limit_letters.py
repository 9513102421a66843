"""Delivery-limit letters made as a consumer's connection drops are bounded by the memory budget
(issue 31, docs/bounds.md).

A consumer takes 1,000 deliveries of a queue with ``x-delivery-limit`` 1 that dead-letters into
a fanout bound to 60 queues, settles none, and drops its socket, twice. Every delivery comes
back a failed attempt, the second time past its limit: 1,000 letters of 60 copies each. The
copies of a letter share its payload, but each costs its own 384 bytes: some 27 MB against a
16 MiB budget, and no consumer left to charge them to (its link and connection are gone). They
are the budget's: copies are made only within its room, the rest wait with their messages held
in place, counted, and a prober publishing and consuming on its own queue is served all along.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Message
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.prober import Prober
from support.raw_client import RawClient

BUDGET: Final = 16 * 1024 * 1024
MESSAGES: Final = 1_000
SINKS: Final = tuple(f"dll-sink{index}" for index in range(60))
FEED: Final = "dll-feed"
BODY: Final = "x" * 4_000
# A served prober's round takes well under a second, even on a loaded machine.
SERVED: Final = 5.0


@pytest.mark.slow
@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_letters_of_a_dropped_consumers_deliveries_at_their_limit_stay_within_the_budget(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=BUDGET)
    server = running.server
    registry = server.registry
    router = registry.dead_letter_router
    budget = server.broker.publishing.budget

    def declare() -> None:
        registry.declare_exchange("dll-fan", "fanout")
        registry.declare_queue(FEED, {"x-dead-letter-exchange": "dll-fan", "x-delivery-limit": 1})
        for name in SINKS:
            registry.declare_queue(name, {})
            registry.bind("dll-fan", name)

    def ready(name: str) -> int:
        queue = registry.get(name)
        assert queue is not None
        return queue.statistics().ready

    running.call(declare)
    publisher = BlockingConnection(running.url, timeout=10)
    sender = publisher.create_sender(f"/queues/{FEED}")
    for _ in range(MESSAGES):
        sender.send(Message(body=BODY))
    publisher.close()
    samples: list[tuple[int, int, int]] = []
    with Prober(running.url, "/queues/dll-prober") as prober:
        # The first drop brings every message back with one failed delivery, the second past
        # the limit (a classic queue's rule: a count above x-delivery-limit).
        taken = [_take_and_drop(running.port) for _ in range(2)]
        # Every delivery came back at its limit: its letter is stored, or waits for room.
        wait_until(lambda: running.call(lambda: router.waiting), 30)
        rounds = len(prober.seen.rounds)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            samples.append(
                running.call(lambda: (registry.held.total, budget.used, len(router.outbox)))
            )
            time.sleep(0.1)
        prober.wait_rounds(rounds + 3, timeout=30)
        stored = running.call(lambda: [ready(name) for name in SINKS])
        waiting = running.call(lambda: len(router.outbox))
        dropped = running.call(lambda: router.dropped)
    seen = prober.seen
    assert taken == [MESSAGES, MESSAGES]
    # The copies never grow what the budget counts past it, nor its count past the ceiling.
    assert max(held for held, _, _ in samples) <= BUDGET
    assert max(used for _, used, _ in samples) <= budget.ceiling
    # Every message is a letter, stored in every sink or waiting; none lost.
    assert len(set(stored)) == 1
    assert stored[0] > 0
    assert waiting > 0
    assert stored[0] + waiting == MESSAGES
    assert dropped == 0
    assert seen.failures == []
    assert len(seen.rounds) >= rounds + 3
    assert seen.worst < SERVED


def _take_and_drop(port: int) -> int:
    """Take every message of the feed unsettled, then drop the socket: how many came."""
    attacker = RawClient.connect("127.0.0.1", port)
    attacker.begin()
    handle = attacker.attach("taker", "receiver", source=f"/queues/{FEED}")
    attacker.flow(handle, link_credit=MESSAGES)
    taken = 0
    while taken < MESSAGES and attacker.next_message(10) is not None:
        taken += 1
    attacker.abort()
    return taken
