"""Dead letters from another worker never take a blocked worker through its margin (issue 31's
seed 65400, docs/bounds.md).

Worker 1's budget is blocked by a queue its own publisher filled (that publisher held). A
consumer on worker 0 rejects messages of a queue there that dead-letters into a fanout bound to
many queues of worker 1, each too light to weigh as a holder's. Before, worker 1 stored the
letters into those light queues while blocked, through its margin up to the ceiling, where every
publisher waits: nobody held, nobody consuming them, for good. Now letters always park while the
budget is blocked, within the part of the margin kept for them (their sender's window), and a
publisher on worker 1 is served; once the full queue is drained, every letter arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, BlockingSender, SendException
from support.workers import blocking_on, budget_used, drained, homed_on, metered_workers

from sluicegate.clients.management import ManagementClient
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD

pytestmark = pytest.mark.slow

# Each worker's share of a 16 MiB budget over two; its margin, an eighth; the part of the
# margin kept for the other worker's letters, a quarter (session/memory_budget.py).
LIMIT: Final = 8 * 1024 * 1024
MARGIN: Final = LIMIT // 8
LETTERS_PART: Final = MARGIN // 4
FILL_BODY: Final = "x" * 100_000
# Small letters into many queues: each queue's 150 KB stay under a holder's floor (a quarter of
# the margin), while together they are 3.6 MB, three times the margin, and under the limit.
LETTER_BODY: Final = "l" * 5_000
SINKS: Final = 24
MESSAGES: Final = 30


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    with metered_workers(tmp_path, "16MiB") as (port, pids):
        yield port, pids, tmp_path


def _fill(sender: BlockingSender) -> int:
    """Send until worker 1's budget holds the sender: how many were settled."""
    stored = 0
    while True:
        try:
            sender.send(Message(body=FILL_BODY), timeout=3)
        except (Timeout, SendException):
            return stored
        stored += 1


def _reject_all(connection: BlockingConnection, queue: str) -> int:
    """Reject every message of ``queue``: how many."""
    receiver = connection.create_receiver(f"/queues/{queue}", credit=20)
    rejected = 0
    try:
        while rejected < MESSAGES:
            receiver.receive(timeout=5)
            receiver.reject()
            rejected += 1
    except Timeout:
        pass
    # A blocking connection writes only within its calls: the close sends the last reject.
    receiver.close()  # type: ignore[no-untyped-call]
    return rejected


def test_letters_into_light_queues_of_a_blocked_worker_park_within_their_part_of_the_margin(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    full = homed_on(1, 2, "margin-full")
    feed = homed_on(0, 2, "margin-feed")
    sinks = [homed_on(1, 2, f"margin-sink{n}-") for n in range(SINKS)]
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    filler = blocking_on(port, pids, pids[1])
    near = blocking_on(port, pids, pids[0])
    try:
        exchange = {"type": "fanout", "durable": False, "internal": False, "arguments": {}}
        assert management.request("PUT", "/exchanges/margin-fan", exchange).status == 204
        body = {"durable": False, "arguments": {"x-dead-letter-exchange": "margin-fan"}}
        assert management.request("PUT", f"/queues/{feed}", body).status == 201
        for name in [full, *sinks]:
            assert management.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
        for name in sinks:
            binding = {"source": "margin-fan", "destination_queue": name, "arguments": {}}
            assert management.request("POST", "/bindings", binding).status == 204
        sender = near.create_sender(f"/queues/{feed}")
        for _ in range(MESSAGES):
            sender.send(Message(body=LETTER_BODY))
        sender.close()  # type: ignore[no-untyped-call]

        assert _fill(filler.create_sender(f"/queues/{full}")) > 0
        # Blocked from the read that reached the limit until the bytes are back at 80 %.
        blocked_at = budget_used(data_dir, 1)
        assert blocked_at >= LIMIT * 0.9
        rejected = _reject_all(near, feed)
        assert rejected == MESSAGES
        # What worker 1 counts while the letters come: at most the part kept for them more
        # (with a queue's overhead for each letter in it, and one letter alone past it).
        in_part = LETTERS_PART // len(LETTER_BODY) + 1
        bound = blocked_at + LETTERS_PART + in_part * MESSAGE_OVERHEAD + len(LETTER_BODY)
        highest = max(budget_used(data_dir, 1) for _ in range(40))
        assert highest <= bound, f"worker 1 counts {highest:.0f} bytes, at most {bound:.0f}"
        assert highest < LIMIT + MARGIN

        # A publisher of a small queue on worker 1 is no holder: served.
        probe = homed_on(1, 2, "margin-probe")
        assert management.request("PUT", f"/queues/{probe}", {"durable": False}).status == 201
        far = blocking_on(port, pids, pids[1])
        try:
            far.create_sender(f"/queues/{probe}").send(Message(body="probe"), timeout=10)
            # Drained, worker 1 lets go: the parked letters are stored, none lost.
            assert drained(far, full, 100) > 0
            assert drained(far, sinks[0], 100) == MESSAGES
        finally:
            far.close()
    finally:
        management.close()
        near.close()
        filler.close()
