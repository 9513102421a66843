"""A dead letter's copies to another worker's queues go in groups that fit the letters'
window (issue 31, adversary seed 69004, docs/workers.md).

A consumer on worker 1 rejects the messages of a queue of worker 1 that dead-letters into a
fanout bound to 20 queues of worker 0: each letter's copies come to 800 KB, three windows.
Before, a letter was weighed with all its copies but went whole once the window was empty,
so worker 1 had 800 KB of letters out to worker 0 at once, past its 256 KiB window (seed
69004: 3.6 MB against 1.05 MB). Now the copies go a window at a time, the rest waiting on
worker 1 for worker 0's confirms; the most worker 1 ever had out is read from its
`sluicegate_memory_budget_letters_window_peak_bytes`, and every queue gets every letter
once, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection
from support.workers import blocking_on, homed_on, metered_workers, own_sample

from sluicegate.clients.management import ManagementClient

# Each worker's share of a 16 MiB budget over two, its margin (an eighth), and its letters'
# window to its one peer: the quarter of the margin kept for letters (session/memory_budget.py).
LIMIT: Final = 8 * 1024 * 1024
WINDOW: Final = LIMIT // 8 // 4
SINKS: Final = 20
MESSAGES: Final = 8
# 40 KB a copy: a letter's 20 copies are 800 KB, three windows.
FILL: Final = "x" * 40_000


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    with metered_workers(tmp_path, "16MiB") as (port, pids):
        yield port, pids, tmp_path


def _bodies(connection: BlockingConnection, queue: str) -> list[int]:
    """The numbers of the letters ``queue`` holds, in its order, waiting up to 30 s for all
    of them (each group waits for worker 0's confirms of the one before)."""
    receiver = connection.create_receiver(f"/queues/{queue}", credit=MESSAGES)
    numbers: list[int] = []
    try:
        while len(numbers) < MESSAGES:
            message = receiver.receive(timeout=30)
            numbers.append(int(str(message.body)[:4]))
            receiver.accept()
        # Nothing more: no letter came twice.
        receiver.receive(timeout=1)
        numbers.append(-1)
    except Timeout:
        pass
    receiver.close()  # type: ignore[no-untyped-call]
    return numbers


@pytest.mark.slow
def test_a_letters_copies_to_another_worker_go_in_groups_within_the_window(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    feed = homed_on(1, 2, "grouped")
    sinks = [homed_on(0, 2, f"group-sink{n}") for n in range(SINKS)]
    near = blocking_on(port, pids, pids[1])
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    try:
        exchange = {"type": "fanout", "durable": False, "internal": False, "arguments": {}}
        assert management.request("PUT", "/exchanges/group-fan", exchange).status == 204
        body = {"durable": False, "arguments": {"x-dead-letter-exchange": "group-fan"}}
        assert management.request("PUT", f"/queues/{feed}", body).status == 201
        for name in sinks:
            assert management.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
            binding = {"source": "group-fan", "destination_queue": name, "arguments": {}}
            assert management.request("POST", "/bindings", binding).status == 204
        sender = near.create_sender(f"/queues/{feed}")
        for index in range(MESSAGES):
            sender.send(Message(body=f"{index:04d}{FILL}"))
        sender.close()  # type: ignore[no-untyped-call]
        rejecter = near.create_receiver(f"/queues/{feed}", credit=MESSAGES)
        for _ in range(MESSAGES):
            rejecter.receive(timeout=10)
            rejecter.reject()
        # A blocking connection writes only within its calls: the close sends the last reject.
        rejecter.close()  # type: ignore[no-untyped-call]
        for name in sinks:
            assert _bodies(near, name) == list(range(MESSAGES)), name
        peak = own_sample(data_dir, 1, "sluicegate_memory_budget_letters_window_peak_bytes")
        # Before: a whole letter's 800 KB at once.
        assert 0 < peak <= WINDOW, f"worker 1 had {peak:.0f} bytes of letters out, window {WINDOW}"
    finally:
        management.close()
        near.close()
