"""Deliveries that cross from another worker's queue are new bytes in the consumer's worker, so
its consumers ask for them within its memory budget (issue 31, docs/workers.md).

A local queue's deliveries waiting in a session are bytes the queue counts already; another
worker's come over the channel and are counted where they wait. Worker 1 holds 25 MB of its
own, under its 32 MiB share of the budget; three connections on worker 1 then take credit for
all of worker 0's 27 MB and never read. Each may hold its own limit of waiting deliveries
(``max_outgoing_pending_size``, 8 MiB) and its writer's buffer: before, worker 1 asked for
them whatever its budget said and counted them far past its ceiling, where every publisher on
it waits (the adversary's seed 65200). Now, once it is blocked, a connection asks only while
less than a batch of 256 KiB is unsent in it, and half way through the margin only while
nothing is, so the count stays under the ceiling and a publisher of a small queue there is
served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.workers import blocking_on, budget_used, homed_on, metered_workers, own_sample

from sluicegate.clients.management import ManagementClient

MESSAGES: Final = 1_000
BODY: Final = "x" * 30_000
READERS: Final = 3
# A polite consumer's messages, read from worker 1 while it stays blocked.
POLITE: Final = 5
# Worker 1's own messages: 25.5 MB, under its limit and above its resume mark.
OWN: Final = 850
# Each worker's share of a 64 MiB budget over two, and its ceiling: the limit and an eighth.
LIMIT: Final = 32 * 1024 * 1024
CEILING: Final = LIMIT + LIMIT // 8


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    # Consumers that never read stay for the test's length: send_timeout would drop them
    # (its own test: test_outbound_flow.py).
    with metered_workers(tmp_path, "64MiB", "--send-timeout", "0") as (port, pids):
        yield port, pids, tmp_path


@pytest.mark.slow
def test_consumers_of_another_workers_queue_ask_only_while_their_worker_has_room(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    queues = [homed_on(0, 2, f"imported{n}") for n in range(READERS)]
    owner = blocking_on(port, pids, pids[0])
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    readers: list[BlockingConnection] = []
    try:
        for queue in queues:
            assert management.request("PUT", f"/queues/{queue}", {"durable": False}).status == 201
            sender = owner.create_sender(f"/queues/{queue}")
            for _ in range(MESSAGES // READERS):
                sender.send(Message(body=BODY))
            sender.close()  # type: ignore[no-untyped-call]
        local = blocking_on(port, pids, pids[1])
        own = homed_on(1, 2, "import-own")
        assert management.request("PUT", f"/queues/{own}", {"durable": False}).status == 201
        sender = local.create_sender(f"/queues/{own}")
        for _ in range(OWN):
            sender.send(Message(body=BODY))
        local.close()
        for queue in queues:
            reader = blocking_on(port, pids, pids[1])
            readers.append(reader)
            # Credit for every message, and then never a read: the deliveries wait on worker 1.
            reader.create_receiver(f"/queues/{queue}", credit=MESSAGES)
        # Blocked by them: what the readers that do not read hold may then go back to worker 0
        # once another consumer waits for the imports' part, so the count may fall below the
        # limit again, the budget staying blocked until its resume mark.
        blocked = "sluicegate_memory_budget_blocked"
        wait_until(lambda: own_sample(data_dir, 1, blocked) == 1, 30)
        peak = max(budget_used(data_dir, 1) for _ in range(20))
        assert peak <= CEILING, f"worker 1 counts {peak:.0f} bytes, ceiling {CEILING}"
        publisher = blocking_on(port, pids, pids[1])
        try:
            probe = homed_on(1, 2, "import-probe")
            assert management.request("PUT", f"/queues/{probe}", {"durable": False}).status == 201
            # A publisher of a small queue there is no holder: served, not blocked.
            publisher.create_sender(f"/queues/{probe}").send(Message(body="probe"), timeout=10)
        finally:
            publisher.close()
        # A consumer there of another queue on worker 0 that reads is served too: what the
        # readers hold unsent goes back to worker 0 when it waits for the imports' part
        # (adversary seeds 66103 and 65800), and they ask for no more while they read nothing.
        across = homed_on(0, 2, "import-polite")
        assert management.request("PUT", f"/queues/{across}", {"durable": False}).status == 201
        sender = owner.create_sender(f"/queues/{across}")
        for n in range(POLITE):
            sender.send(Message(body=f"polite {n}"))
        polite = blocking_on(port, pids, pids[1])
        try:
            receiver = polite.create_receiver(f"/queues/{across}", credit=POLITE)
            bodies = [receiver.receive(timeout=10).body for _ in range(POLITE)]
            assert bodies == [f"polite {n}" for n in range(POLITE)]
        finally:
            polite.close()
        assert max(budget_used(data_dir, 1) for _ in range(20)) <= CEILING
        given_back = "sluicegate_memory_budget_imports_given_back_total"
        assert own_sample(data_dir, 1, given_back) > 0
        stalled = "sluicegate_consumer_links_stalled"
        assert own_sample(data_dir, 1, stalled) > 0
        for reader in readers:
            reader.close()
        readers.clear()
        # Closed, they leave nothing stalled or reserved behind.
        wait_until(lambda: own_sample(data_dir, 1, stalled) == 0, 10)
        reserved = "sluicegate_memory_budget_import_reserved_bytes"
        wait_until(lambda: own_sample(data_dir, 1, reserved) == 0, 10)
    finally:
        for reader in readers:
            reader.close()
        management.close()
        owner.close()


# Session 28's reproduction: small deliveries first, so the link's reservation is sized by
# them, then large ones on the same credit.
SMALL: Final = 3
LARGE_BODY: Final = "y" * 200_000
LARGE: Final = 100


@pytest.mark.slow
def test_deliveries_larger_than_any_before_bring_no_more_than_was_reserved(
    two_workers: tuple[int, list[int], Path],
) -> None:
    """Reserved by the largest delivery seen, a request's batch of larger ones came whole: on
    worker 1, holding 25 MB of its own, a consumer of worker 0's queue that never read counted
    17.2 MB of 200 KB deliveries sent on credit reserved at 100 bytes each, 42.3 MB against its
    37.7 MB ceiling, where every publisher on it waits. The owner now sends no more than the
    request's byte limit and holds back the rest, telling the consumer's session what the next
    costs (frames.Short), which reserves for it within the room and asks again."""
    port, pids, data_dir = two_workers
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    owner = blocking_on(port, pids, pids[0])
    local = blocking_on(port, pids, pids[1])
    reader = blocking_on(port, pids, pids[1])
    try:
        queue = homed_on(0, 2, "growing")
        own = homed_on(1, 2, "growing-own")
        for name in (queue, own):
            assert management.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
        sender = owner.create_sender(f"/queues/{queue}")
        bodies = ["x" * 100] * SMALL + [LARGE_BODY] * LARGE
        for body in bodies:
            sender.send(Message(body=body))
        own_sender = local.create_sender(f"/queues/{own}")
        for _ in range(OWN):
            own_sender.send(Message(body=BODY))
        assert own_sample(data_dir, 1, "sluicegate_memory_budget_blocked") == 0
        receiver = reader.create_receiver(f"/queues/{queue}", credit=len(bodies))
        # The client reads nothing: what crosses waits on worker 1.
        for _ in range(20):
            assert budget_used(data_dir, 1) <= CEILING
            time.sleep(0.1)
        # Once it reads, everything arrives, once, in order.
        got = []
        for _ in bodies:
            got.append(receiver.receive(timeout=20).body)
            receiver.accept()
        assert got == bodies
    finally:
        for connection in (reader, local, owner):
            connection.close()
        management.close()
