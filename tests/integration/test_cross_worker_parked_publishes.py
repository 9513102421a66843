"""What a worker parks for another worker's publishers is counted by the publishers' worker, so
neither worker's budget goes past its ceiling (issue 31, docs/workers.md, docs/bounds.md).

Adversary seed 65401 with two workers: publishers on worker 0 to a queue of worker 1, whose
budget was blocked, sent within the credit worker 0 granted; worker 1 parked their messages
(it must read the channel, which carries its consumers' settlements) and counted them, but the
publishers were worker 0's and worker 0 counted nothing once they had crossed, so it went on
granting credit to every new link: worker 1's count reached 3.6 times its limit and every
publisher there waited for good. Now the sender counts what it sent until the owner confirms
it, which holds its publishers as a local queue's bytes would, and the owner stores what it
parked only as far as its limit.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Final, cast

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection, BlockingSender, SendException
from support.ports import free_port
from support.process import serving
from support.workers import blocking_on, budget_used, children, homed_on, own_sample, worker_of

from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.session.memory_budget import LETTERS_SHARE

BODY: Final = "x" * 100_000
# Each worker's share of a 16 MiB budget over two, and its ceiling: the limit and an eighth.
LIMIT: Final = 8 * 1024 * 1024
CEILING: Final = LIMIT + LIMIT // 8
# Links on worker 0 that each take whatever credit they are granted: before, each new link's
# credit was backed by a budget that did not count what the others had sent across.
LINKS: Final = 6
# Rounds of half a second with nothing received once the queue is drained.
DRAINED_ROUNDS: Final = 6
# What worker 1 keeps parked of worker 0's publishes: a quarter of its 1 MiB margin
# (the letters' window, gateway/peers.py's ``_give_back``).
PARKED_WINDOW: Final = (LIMIT // 8) // LETTERS_SHARE
# What one reactor pass may read past the ceiling before the budget holds the connections: a
# read of each of the two connections (gateway/reading.py reads 256 KiB at most).
READ: Final = 2 * 256 * 1024


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path, int]]:
    """``serve --workers 2`` with a 16 MiB budget: its port, workers, data and metrics port
    (worker 0's endpoint, which adds up both workers' counts)."""
    metrics = free_port()
    options = (
        "--workers",
        "2",
        "--worker-handover",
        "false",
        "--data-dir",
        str(tmp_path),
        "--memory-budget",
        "16MiB",
    )
    endpoints = ("--metrics-listen", f"127.0.0.1:{metrics}", "--http-api-listen", "off")
    with serving(*options, *endpoints) as (process, port):
        yield port, sorted(children(process.pid), key=worker_of), tmp_path, metrics


def _total(metrics: int, name: str) -> float:
    """Both workers' samples of ``name``, added up by worker 0's endpoint."""
    url = f"http://127.0.0.1:{metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} sample")


def _pump(connections: list[BlockingConnection]) -> None:
    """Let each connection write what its links queued and read what came."""
    for connection in connections:
        with contextlib.suppress(Timeout):
            connection.wait(lambda: False, timeout=0.2)


def _fill(sender: BlockingSender) -> int:
    """Send until the budget holds the sender (its settlement never comes): how many were
    settled."""
    stored = 0
    while True:
        try:
            sender.send(Message(body=BODY), timeout=3)
        except (Timeout, SendException):
            return stored
        stored += 1


def _send_all_credit(
    connections: list[BlockingConnection], senders: list[BlockingSender]
) -> list[Delivery]:
    """Send a message for every credit the server grants, until it grants none for two
    seconds and what was sent is read as far as the server reads it: the deliveries sent."""
    sent: list[Delivery] = []
    while True:
        for sender in senders:
            while sender.link.credit > 0:
                sent.append(cast(Delivery, sender.link.send(Message(body=BODY))))
        granted = False
        for connection in connections:
            try:
                connection.wait(lambda: any(s.link.credit > 0 for s in senders), timeout=1)
                granted = True
            except Timeout:
                pass
        if not granted:
            return sent


@pytest.mark.slow
def test_publishes_parked_for_another_worker_keep_both_workers_within_their_ceilings(
    two_workers: tuple[int, list[int], Path, int],
) -> None:
    port, pids, data_dir, metrics = two_workers
    full = f"/queues/{homed_on(1, 2, 'parked-full')}"
    filler = blocking_on(port, pids, pids[1])
    far = [blocking_on(port, pids, pids[0]) for _ in range(2)]
    try:
        stored = _fill(filler.create_sender(full))
        assert stored > 40
        # Attached first: a connection the budget holds is not read, its ATTACH with it.
        senders = [far[n % 2].create_sender(full, name=f"parked-{n}") for n in range(LINKS)]
        sent = _send_all_credit(far, senders)
        # The links' credit took far more than a budget across (170 messages each): worker 0
        # counts what it sent and worker 1 has not confirmed, and holds its publishers at its
        # ceiling; worker 1 does not count what it parked. Before, worker 0 counted nothing,
        # read everything, and worker 1 counted all of it: 10 times its ceiling here.
        assert len(sent) * len(BODY) > 4 * CEILING
        owner = budget_used(data_dir, 1)
        assert owner <= CEILING, f"worker 1 counts {owner:.0f} bytes, ceiling {CEILING}"
        senders_worker = _total(metrics, "sluicegate_memory_budget_used_bytes") - owner
        assert senders_worker <= CEILING + READ, f"worker 0 counts {senders_worker:.0f} bytes"
        # Worker 1 keeps parked a window of worker 0's publishes and gives the rest back:
        # kept whole, they were counted by worker 0 for as long as worker 1 stayed blocked
        # (adversary seed 71002: 32.5 MB, 5.5 MB past worker 0's ceiling).
        sent_bytes = "sluicegate_memory_budget_channel_sent_bytes"
        parked = _total(metrics, sent_bytes) - own_sample(data_dir, 1, sent_bytes)
        assert parked <= PARKED_WINDOW + len(BODY) + MESSAGE_OVERHEAD
        given_back = own_sample(data_dir, 1, "sluicegate_memory_budget_channel_given_back_total")
        assert given_back > 0
        # Drained, worker 1 stores what it parked: every publish is accepted or given back
        # released, and every accepted one is there.
        consumer = blocking_on(port, pids, pids[1])
        receiver = consumer.create_receiver(full, credit=50)
        received = idle = 0
        while idle < DRAINED_ROUNDS:
            try:
                receiver.receive(timeout=0.5)
            except Timeout:
                idle += 1
                _pump(far)  # a blocking client writes and reads only within its own calls
                continue
            receiver.accept()
            received += 1
            idle = 0
        outcomes = Counter(delivery.remote_state for delivery in sent)
        assert outcomes[Delivery.RELEASED] == given_back
        assert outcomes[Delivery.ACCEPTED] + outcomes[Delivery.RELEASED] == len(sent)
        # And the filler's last send, which waited for its settlement while the budget held it.
        assert received == stored + outcomes[Delivery.ACCEPTED] + 1
        far.append(consumer)
    finally:
        for connection in (filler, *far):
            connection.close()
