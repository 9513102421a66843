"""A delivery still arriving never takes a blocked budget past its ceiling (issue 31's seed
65501, docs/bounds.md).

The budget is blocked by a queue nobody consumes, its publisher held. A client that holds
nothing begins a delivery larger than the whole margin and sends all of it but its end. Before,
the oldest arriving delivery was always read, so it went on through the margin and past the
ceiling, where every publisher waits, with bytes no consumer can drain. It now stops at the part
of the margin kept for deliveries still arriving (session/memory_budget.py): the server counts
at most that and one read more for it, and a prober is served on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import proton
from integration.conftest import RunningServer
from integration.test_memory_bounds import UnfinishedAttack, _more_rounds, _probing
from proton.utils import BlockingConnection, SendException
from support.polling import wait_until

from sluicegate.gateway.reading import READ_BATCH

MiB: Final = 1024 * 1024
BUDGET: Final = 4 * MiB
# Larger than the budget's whole margin (an eighth of it, 512 KiB), within the largest message.
DELIVERY: Final = 3 * MiB // 2


def _fill(server: RunningServer, queue: str) -> int:
    """Publish 100 KB messages to ``queue`` until the budget holds the publisher: how many
    were settled."""
    connection = BlockingConnection(server.url, timeout=10)
    sender = connection.create_sender(f"/queues/{queue}")
    stored = 0
    try:
        while True:
            try:
                sender.send(proton.Message(body=b"f" * 100_000), timeout=3)
            except (proton.Timeout, SendException):
                return stored
            stored += 1
    finally:
        # Held, its close is not read until the hold ends: its socket goes with the server.
        del connection


def test_a_delivery_begun_while_the_budget_is_blocked_stops_at_its_part_of_the_margin(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(memory_budget=BUDGET, max_message_size=2 * MiB)
    budget = server.server.broker.publishing.budget
    with _probing(server, "probe-margin") as prober:
        assert _fill(server, "margin-full") > 0
        assert server.call(lambda: budget.blocked)
        attack = UnfinishedAttack(server, 0, DELIVERY)
        attack.start()
        flow = server.server.broker.publishing.flow

        def stopped() -> bool:
            oldest = next(iter(flow.arriving), None)
            return oldest is not None and (oldest.budget_paused or oldest.unfinished >= DELIVERY)

        wait_until(lambda: server.call(stopped), timeout=30)
        unfinished, part, used, ceiling = server.call(
            lambda: (budget.unfinished, budget.unfinished_part, budget.current, budget.ceiling)
        )
        # Before: the whole delivery read, 1.5 MiB, the count 1 MB past the ceiling.
        assert unfinished <= part + READ_BATCH, f"{unfinished} bytes arriving, part {part}"
        assert used < ceiling
        _more_rounds(prober, 3)
        attack.client.reset(attack)
