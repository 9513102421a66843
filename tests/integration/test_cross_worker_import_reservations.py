"""Credit a consumer's worker granted another worker's queues before its budget blocked is
reserved in its budget, so what the owner sends on it when the queues fill lands within it
(issue 31, session/waiting.py, docs/bounds.md).

Eighty consumers on worker 1 of eighty empty queues of worker 0 are each sent one message and
read it, so that each asks for a batch of four more (256 KiB of them), which the empty queues
keep as credit. Worker 1 is then blocked by its own publisher, and worker 0's queues fill
while the consumers' clients read nothing. Before, each link kept its credit and the owner
sent it all: eighty batches, some 19 MB, past a blocked worker's 32 MiB limit and over its
ceiling (a 47.5 MB peak measured against 37.7 MB). Now that
credit counts in worker 1's budget from the moment it is granted (its own publisher is held
that much earlier) and whatever the owner sends on it adds nothing; once the budget lets go,
every message arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, BlockingReceiver
from support.workers import blocking_on, budget_used, homed_on, metered_workers, own_sample

from sluicegate.clients.management import ManagementClient

# Many links on few connections: what a connection's client does not read stays in the
# server only beyond what the kernel's socket buffers take (some 2 MB a connection here).
LINKS: Final = 80
PER_CONNECTION: Final = 40
# Worker 0's messages per queue once worker 1 is blocked: more than a batch of four.
MESSAGES: Final = 5
BODY: Final = "x" * 60_000
# Worker 1's own messages, large so that few fill it: every client here must be heard from
# within the server's idle timeout (60 s).
OWN_BODY: Final = "o" * 250_000
# Each worker's share of a 64 MiB budget over two, and its ceiling: the limit and an eighth.
LIMIT: Final = 32 * 1024 * 1024
CEILING: Final = LIMIT + LIMIT // 8
SAMPLES: Final = 60


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    # Consumers that never read stay for the test's length: send_timeout would drop them
    # (its own test: test_outbound_flow.py).
    with metered_workers(tmp_path, "64MiB", "--send-timeout", "0") as (port, pids):
        yield port, pids, tmp_path


def _blocked(data_dir: Path, worker: int) -> bool:
    """Whether worker ``worker``'s memory budget is blocked, as its metrics say."""
    return own_sample(data_dir, worker, "sluicegate_memory_budget_blocked") == 1


def _body(n: int) -> str:
    return f"{n:04}{BODY}"


@pytest.mark.slow
def test_credit_granted_before_the_budget_blocked_brings_nothing_past_the_ceiling(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    queues = [homed_on(0, 2, f"reserved{n}") for n in range(LINKS)]
    owner = blocking_on(port, pids, pids[0])
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    readers: list[BlockingConnection] = []
    receivers: list[BlockingReceiver] = []
    try:
        senders = []
        for queue in queues:
            assert management.request("PUT", f"/queues/{queue}", {"durable": False}).status == 201
            sender = owner.create_sender(f"/queues/{queue}")
            sender.send(Message(body=_body(0)))
            senders.append(sender)
        for n, queue in enumerate(queues):
            if n % PER_CONNECTION == 0:
                readers.append(blocking_on(port, pids, pids[1]))
            receiver = readers[-1].create_receiver(f"/queues/{queue}", credit=100)
            # Read and accepted: its size known, the link asks for a batch of eight more,
            # which the empty queue keeps as credit.
            assert receiver.receive(timeout=20).body == _body(0)
            receiver.accept()
            receivers.append(receiver)
        local = blocking_on(port, pids, pids[1])
        own = homed_on(1, 2, "reserved-own")
        assert management.request("PUT", f"/queues/{own}", {"durable": False}).status == 201
        sender = local.create_sender(f"/queues/{own}")
        # Worker 1's own publisher fills it up to its limit, where the budget blocks; the
        # message that blocks it is settled only once it lets go.
        blocked = False
        while not blocked:
            used = budget_used(data_dir, 1)
            # Half the way left at a time: a few reads of the metrics, not one per message.
            for _ in range(max(1, int(LIMIT - used) // len(OWN_BODY) // 2)):
                try:
                    sender.send(Message(body=OWN_BODY), timeout=5)
                except Timeout:
                    break
            blocked = _blocked(data_dir, 1)
        # Worker 0's queues fill; worker 1's consumers read nothing.
        for sender in senders:
            for n in range(1, MESSAGES + 1):
                sender.send(Message(body=_body(n)))
        peak = max(budget_used(data_dir, 1) for _ in range(SAMPLES))
        assert peak <= CEILING, f"worker 1 counts {peak:.0f} bytes, ceiling {CEILING}"
        # The budget lets go: every message arrives, once and in order.
        with ManagementClient(f"amqp://127.0.0.1:{port}") as deleting:
            assert deleting.request("DELETE", f"/queues/{own}").status == 200
        local.close()
        for receiver in receivers:
            for n in range(1, MESSAGES + 1):
                assert receiver.receive(timeout=30).body == _body(n)
                receiver.accept()
    finally:
        for reader in readers:
            reader.close()
        management.close()
        owner.close()
