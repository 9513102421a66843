"""A consumer's dead-letter fan-out is charged to its own connection's account (issue 31).

A consumer rejects every message of three queues that dead-letter into a fanout bound to all
three: each rejection makes three copies. Its letters are work it caused, charged to its
connection's account as a publisher's routed copies are (docs/bounds.md): once the memory
budget makes them wait, the account passes its limit and the consumer's socket is no longer
read, while another connection is served and no message is lost. Before, the account was never
charged: the consumer's debt stayed 0 while its letters waited. (With the budget full, a
publisher is held by the budget whoever filled it, docs/inbound-flow-control.md: the client
served here consumes, as in test_dead_letter_bounds.py.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from integration.test_dead_letter_bounds import SERVED, _Rejecter, consume_other, seed_other
from proton import Message
from proton.reactor import Container
from proton.utils import BlockingConnection
from support.polling import wait_until

QUEUES: Final = ("dd-q1", "dd-q2", "dd-q3")
# Below the letters this attack makes wait (about 210 of 32 KB fill the 8 MiB budget): with the
# default (400) its debt stops there, the budget having held the copies first.
LIMIT: Final = 50
# The rejecter's prefetch on each of its links: what it can hold unsettled, and so reject in
# one read, beyond the limit.
PREFETCH: Final = 100


@pytest.mark.slow
def test_a_consumers_dead_letter_fan_out_pauses_its_own_reads_and_no_one_elses(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=8 * 1024 * 1024, account_limit=LIMIT)
    server = running.server
    registry = server.registry
    router = registry.dead_letter_router

    def declare() -> None:
        registry.declare_exchange("dd-fan", "fanout")
        for name in QUEUES:
            registry.declare_queue(name, {"x-dead-letter-exchange": "dd-fan"})
            registry.bind("dd-fan", name)

    def debts() -> list[tuple[int, bool, int]]:
        """Each open connection's (debt, reads paused, pauses)."""
        return [
            (c.account.debt, c.reads_paused, c.account.pauses) for c in server.broker.connections
        ]

    def stored() -> int:
        return sum(s.ready + s.unacked for s in registry.statistics() if s.name in QUEUES)

    running.call(declare)
    # Another client's messages, published before the attack, consumed while it runs.
    seed_other(running.url, "/queues/dd-other")
    rejecter = _Rejecter(running.url, QUEUES)
    thread = threading.Thread(target=Container(rejecter).run, daemon=True)
    thread.start()
    samples: list[list[tuple[int, bool, int]]] = []
    try:
        publisher = BlockingConnection(running.url, timeout=10)
        publisher.create_sender(f"/queues/{QUEUES[0]}").send(Message(body="x" * 32_000))
        publisher.close()
        # The copies reach the budget (8 MiB is ~250 messages of 32 KB) and wait there.
        wait_until(lambda: running.call(lambda: router.waiting), 60)
        wait_until(lambda: any(paused for _, paused, _ in running.call(debts)), 30)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            samples.append(running.call(debts))
            time.sleep(0.1)
        rejected = rejecter.rejected
        bodies, served = consume_other(running.url, "/queues/dd-other")
        time.sleep(1)
        assert rejecter.rejected == rejected, "the paused consumer went on rejecting"
        letters, waiting, dropped, held = running.call(
            lambda: (
                sum(registry.queue(q).statistics().dead_lettered for q in QUEUES),
                len(registry.dead_letters),
                registry.dead_letter_router.dropped,
                stored(),
            )
        )
        # Room again: the letters are stored, the debt repaid, the consumer read again.
        running.call(lambda: [registry.purge_queue(q) for q in QUEUES[1:]])
        wait_until(lambda: rejecter.rejected > rejected, 30)
    finally:
        rejecter.stopping.set()
        thread.join(10)
    seen = [each for sample in samples for each in sample]
    debt = max(debt for debt, _, _ in seen)
    # At least the limit, at most one read's rejections (all it holds unsettled) past it, plus
    # the copies of the one letter the budget stopped at.
    assert LIMIT <= debt <= LIMIT + PREFETCH * len(QUEUES) + len(QUEUES)
    # The rejecter's reads are paused, and no other connection's ever is.
    assert all(sum(paused for _, paused, _ in sample) == 1 for sample in samples)
    assert waiting > 0
    assert dropped == 0
    # Nothing lost: each routed letter's original left for its three copies; a waiting one's
    # original stays, held at its place (neither ready nor unacked).
    assert held == 1 + (len(QUEUES) - 1) * (letters - waiting) - waiting
    assert bodies == list(range(20))
    assert served < SERVED
