"""Links that come one after another from another worker, each piling up in a queue nobody
reads, never fill the owner's publishers' part (issue 31, adversary seed 65800;
session/remote_publishers.py).

Worker 1's limit is held by a queue nobody reads, its publisher held. Links on worker 0 then
publish, one after another, each to a queue of its own on worker 1 until the owner parks it,
and go. Before, the owner stored what each sent until the next flush weighed it, and held it
once it had grown by a quarter of the whole part (shared among those growing): a fresh link
each time took its share of the whole part and what came before the next weighing, so that
seven links of 20 KB messages filled it to its ceiling, where every publisher waits, with
every link held or gone and the light prober waiting for good. Now each run is admitted only
within its link's share of the part *left*: however many links come, the prober goes on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message
from support.workers import (
    blocking_on,
    connection_on,
    drained,
    homed_on,
    metered_workers,
    own_sample,
    send_until_held,
)

from sluicegate.clients.management import ManagementClient

MiB: Final = 1024 * 1024
# Each worker's share of a 32 MiB budget over two, and where its publishers wait: the limit
# and half its margin (an eighth), the rest kept for letters, imports and deliveries still
# arriving (session/memory_budget.py).
LIMIT: Final = 16 * MiB
PUBLISHING_CEILING: Final = LIMIT + LIMIT // 8 // 2
FILL: Final = b"f" * 100_000
# The links that come in turn: seven filled the part of 1 MiB before.
LINKS: Final = 12
BODY: Final = b"p" * 20_000
# Seconds the prober's publish may wait: before, it waited for good.
PROBE_TIMEOUT: Final = 20


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    with metered_workers(tmp_path, "32MiB") as (port, pids):
        yield port, pids, tmp_path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_links_piling_up_in_turn_from_another_worker_leave_the_prober_room(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    full, probed = homed_on(1, 2, "turns-full"), homed_on(1, 2, "turns-probe")
    piles = [homed_on(1, 2, f"turns-pile{n}") for n in range(LINKS)]
    management = connection_on(
        port,
        pids,
        pids[1],
        lambda: ManagementClient(f"amqp://127.0.0.1:{port}"),
        ManagementClient.close,
    )
    for name in (full, probed, *piles):
        assert management.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
    prober = blocking_on(port, pids, pids[1])
    filler = blocking_on(port, pids, pids[1])
    try:
        probe = prober.create_sender(f"/queues/{probed}")
        probe.send(Message(body="before"), timeout=PROBE_TIMEOUT)
        assert send_until_held(filler.create_sender(f"/queues/{full}"), FILL) > 0
        assert own_sample(data_dir, 1, "sluicegate_memory_budget_blocked") == 1
        stored = []
        for pile in piles:
            far = blocking_on(port, pids, pids[0])
            try:
                stored.append(send_until_held(far.create_sender(f"/queues/{pile}"), BODY))
            finally:
                far.close()
        level = own_sample(data_dir, 1, "sluicegate_memory_budget_publishing_level_bytes")
        # Before: the seventh link took worker 1's level to 17,838,836 bytes, past its
        # publishers' ceiling, and every later one was parked at once (stored: 14, 7, 7, 7, 7,
        # 7, 3, then none); now 17.2 MB (10, 4, 2, 2, 1, 1, 1, then none).
        assert level < PUBLISHING_CEILING, f"level {level:.0f} after links storing {stored}"
        probe.send(Message(body="while blocked"), timeout=PROBE_TIMEOUT)
        # Drained, worker 1 lets go (the filler's connection is held, not read: a reader of
        # its own), and the filler's CLOSE is answered.
        consumer = blocking_on(port, pids, pids[1])
        assert drained(consumer, full, 50) > 0
        consumer.close()
    finally:
        for connection in (prober, filler):
            connection.close()
        management.close()
