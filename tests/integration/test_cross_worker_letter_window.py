"""Dead letters routed to another worker's queues stay within a window until that worker
confirms them, so a fan-out of letters cannot push its budget past the ceiling (issue 31,
docs/workers.md).

A consumer on worker 0 rejects the messages of a queue of worker 0 that dead-letters into a
fanout bound to four queues of worker 1: 4 copies of each 20 KB message, 24 MB in all, three
times worker 1's share of the budget. Letters have no publisher whose credit waits for their
confirm: before the window, worker 0 sent every one and worker 1 parked what its budget had no
room for, counted, until it was far past its ceiling and every publisher there waited (the
adversary's seed 65002). Now the letters wait in their queue on worker 0 and worker 1 parks at
most its window; a publisher on worker 1 is served, and once the four queues are read every
letter arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message
from support.polling import wait_until
from support.workers import blocking_on, budget_used, drained, homed_on, metered_workers

from sluicegate.clients.management import ManagementClient

MESSAGES: Final = 300
BODY: Final = "x" * 20_000
SINKS: Final = 4
# Each worker's share of a 16 MiB budget over two, and its ceiling: the limit and an eighth.
LIMIT: Final = 8 * 1024 * 1024
CEILING: Final = LIMIT + LIMIT // 8


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    with metered_workers(tmp_path, "16MiB") as (port, pids):
        yield port, pids, tmp_path


@pytest.mark.slow
def test_letters_to_another_workers_queues_wait_within_a_window_and_all_arrive(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    feed = homed_on(0, 2, "windowed")
    sinks = [homed_on(1, 2, f"window-sink{n}") for n in range(SINKS)]
    near = blocking_on(port, pids, pids[0])
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    try:
        exchange = {"type": "fanout", "durable": False, "internal": False, "arguments": {}}
        assert management.request("PUT", "/exchanges/window-fan", exchange).status == 204
        body = {"durable": False, "arguments": {"x-dead-letter-exchange": "window-fan"}}
        assert management.request("PUT", f"/queues/{feed}", body).status == 201
        for name in sinks:
            assert management.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
            binding = {"source": "window-fan", "destination_queue": name, "arguments": {}}
            assert management.request("POST", "/bindings", binding).status == 204
        sender = near.create_sender(f"/queues/{feed}")
        for _ in range(MESSAGES):
            sender.send(Message(body=BODY))
        sender.close()  # type: ignore[no-untyped-call]
        rejecter = near.create_receiver(f"/queues/{feed}", credit=20)
        rejected = 0
        try:
            while rejected < MESSAGES:
                rejecter.receive(timeout=5)
                rejecter.reject()
                rejected += 1
        except Exception as error:
            if type(error).__name__ != "Timeout":
                raise
        # A blocking connection writes only within its calls: the close sends the last reject.
        rejecter.close()  # type: ignore[no-untyped-call]
        # Worker 1 parked what it had no room for: at most its window past its limit (before:
        # 3 times its limit, as many letters as worker 0 made).
        wait_until(lambda: budget_used(data_dir, 1) >= LIMIT * 0.8, 30)
        used = budget_used(data_dir, 1)
        assert used <= CEILING, f"worker 1 counts {used:.0f} bytes, ceiling {CEILING}"
        far = blocking_on(port, pids, pids[1])
        try:
            probe = homed_on(1, 2, "window-probe")
            assert management.request("PUT", f"/queues/{probe}", {"durable": False}).status == 201
            # A publisher of a small queue there is no holder: served, not blocked.
            far.create_sender(f"/queues/{probe}").send(Message(body="probe"), timeout=10)
            # Read, the four queues take every letter: none was lost while it waited.
            delivered = [0] * SINKS
            while rejected and sum(delivered) < rejected * SINKS:
                before = sum(delivered)
                for index, name in enumerate(sinks):
                    delivered[index] += drained(far, name, 50)
                if sum(delivered) == before:
                    break
            assert delivered == [rejected] * SINKS
        finally:
            far.close()
    finally:
        management.close()
        near.close()
