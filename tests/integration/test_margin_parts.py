"""Each class of bytes that no hold weighs takes its own part of a blocked budget's margin, so
that none takes another's (issue 31's seeds 65701 and 65802, session/memory_budget.py).

Both attacks block the budget with a queue nobody reads, its publisher held, and add a
delivery that never finishes, bytes no consumer can drain:

- begun before the budget blocked, it stayed whole, past anything the margin keeps for such
  bytes, and took the room the publishers not holding the budget go on in (seed 65701: 3.4 MB
  of a 4 MB margin). A blocked budget now releases deliveries still arriving beyond their part
  (the oldest beyond its part and one read), so its client may send it again later;
- begun after, it was read as the oldest arriving up to half way through the margin, where
  requests for another worker's deliveries stopped too: a consumer on that worker of a queue
  on the other, idle worker got nothing (seed 65802). It now stops at its own part, and the
  consumer imports within the imports' own part.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import proton
import pytest
from integration.conftest import RunningServer
from integration.test_memory_bounds import UnfinishedAttack, _more_rounds, _probing
from integration.test_unfinished_margin import _fill
from proton.utils import BlockingSender, SendException
from support.polling import wait_until
from support.raw_client import ConnectionClosedError, RawClient
from support.workers import blocking_on, budget_used, connection_on, homed_on, metered_workers

from sluicegate.clients.management import ManagementClient
from sluicegate.gateway.reading import READ_BATCH

MiB: Final = 1024 * 1024
BUDGET: Final = 4 * MiB
# Three times the whole margin of a 4 MiB budget (512 KiB), within the largest message.
EARLY: Final = 3 * MiB // 2
# Each worker's share of a 64 MiB budget over two, and its ceiling: the limit and an eighth.
LIMIT: Final = 32 * MiB
CEILING: Final = LIMIT + LIMIT // 8
# Larger than the whole margin of a worker's share (4 MiB).
LATE: Final = 6 * MiB
BODY: Final = b"h" * 300_000
# The light queue's messages on the idle worker, for the blocked worker's consumer.
LIGHT: Final = 20
# Consumers waiting with credit on empty queues across, more than the imports' part holds
# first batches of (two of 256 KiB in 512 KiB).
IDLE: Final = 3


def test_a_delivery_begun_before_the_budget_blocked_is_released_beyond_its_part(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(memory_budget=BUDGET, max_message_size=2 * MiB)
    budget = server.server.broker.publishing.budget
    with _probing(server, "probe-parts") as prober:
        attack = UnfinishedAttack(server, 0, EARLY)
        attack.start()
        # Read whole while the budget has room: the oldest arriving, under no cap.
        wait_until(lambda: server.call(lambda: budget.unfinished) >= EARLY - 65536, timeout=30)
        assert not server.call(lambda: budget.blocked)
        assert _fill(server, "parts-full") > 0
        wait_until(lambda: attack.outcome() == "released", timeout=30)
        unfinished, part, peak, ceiling = server.call(
            lambda: (budget.unfinished, budget.unfinished_part, budget.peak, budget.ceiling)
        )
        # Before: 1.5 MiB kept arriving, three times the margin, for as long as its client
        # stayed; what the publishers not holding the budget go on in was left to them by luck.
        assert unfinished <= part + READ_BATCH
        assert peak <= ceiling
        _more_rounds(prober, 3)
        attack.client.reset(attack)


class _Late(threading.Thread):
    """A raw connection on one worker that begins a delivery of ``LATE`` bytes and never ends
    it; its writes block once the server stops reading it."""

    def __init__(self, port: int, pids: list[int], wanted: int) -> None:
        super().__init__(name="late unfinished", daemon=True)
        self.client = connection_on(
            port,
            pids,
            wanted,
            lambda: RawClient.connect("127.0.0.1", port, container_id="late-unfinished"),
            RawClient.abort,
        )
        self.client.write_timeout = 120.0
        self.client.begin()
        self.handle = self.client.attach("late", "sender", target="/queues/late-unfinished")
        self.client.wait_credit(self.handle)

    def run(self) -> None:
        try:
            self.client.send(self.handle, b"l" * LATE, finish=False)
        except (OSError, ConnectionClosedError):
            return  # reset by the test while the server held the writes back


def _held_after(sender: BlockingSender) -> int:
    """Publish until the budget holds the publisher: how many were settled."""
    for sent in range(10 * LIMIT // len(BODY)):
        try:
            sender.send(proton.Message(body=BODY), timeout=3)
        except (proton.Timeout, SendException):
            return sent
    raise AssertionError("the publisher was never held")


def _settled(data_dir: Path) -> float:
    """Worker 1's count once it stops moving (the late delivery held, or read whole)."""
    last = -1.0
    while True:
        time.sleep(1)
        used = budget_used(data_dir, 1)
        if used == last:
            return used
        last = used


def _consume_light(port: int, pids: list[int], light: str) -> None:
    """A consumer on worker 1 of the light queue on worker 0 gets its messages, in order."""
    consumer = blocking_on(port, pids, pids[1])
    receiver = consumer.create_receiver(f"/queues/{light}", credit=LIGHT)
    for n in range(LIGHT):
        message = receiver.receive(timeout=10)
        assert message.body == f"light {n}"
        receiver.accept()
    consumer.close()


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    with metered_workers(tmp_path, "64MiB") as (port, pids):
        yield port, pids, tmp_path


@pytest.mark.slow
def test_a_consumer_imports_while_its_worker_is_blocked_by_a_delivery_still_arriving(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    heavy, light = homed_on(1, 2, "parts-heavy"), homed_on(0, 2, "parts-light")
    for queue in (heavy, light):
        assert management.request("PUT", f"/queues/{queue}", {"durable": False}).status == 201
    owner = blocking_on(port, pids, pids[0])
    sender = owner.create_sender(f"/queues/{light}")
    for n in range(LIGHT):
        sender.send(proton.Message(body=f"light {n}"))
    # Worker 1's limit held by a queue nobody reads, its publisher held.
    filler = blocking_on(port, pids, pids[1])
    assert _held_after(filler.create_sender(f"/queues/{heavy}")) > 0
    assert budget_used(data_dir, 1) >= LIMIT
    late = _Late(port, pids, pids[1])
    late.start()
    try:
        used = _settled(data_dir)
        assert used <= CEILING, f"worker 1 counts {used:.0f} bytes, ceiling {CEILING}"
        # Before: worker 1 past half way through its margin, nothing of worker 0's queue came.
        _consume_light(port, pids, light)
        assert budget_used(data_dir, 1) <= CEILING
    finally:
        late.client.reset(late)
        owner.close()
        del filler  # held: its close would wait for the hold


@pytest.mark.slow
def test_a_parked_publish_to_a_queue_drained_light_is_stored_while_its_worker_stays_blocked(
    two_workers: tuple[int, list[int], Path],
) -> None:
    """Adversary seed 66100: another worker's publishes to a queue parked while it weighed a
    holder's floor, or at the publishers' ceiling, waited until the budget let go, for good
    while queues nobody reads held it; the prober's among them. Once its queue is light and
    the publishers' part has room, a parked publish is stored as a local light one would be."""
    port, pids, data_dir = two_workers
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    heavy, drained = homed_on(1, 2, "parked-block"), homed_on(1, 2, "parked-drained")
    for queue in (heavy, drained):
        assert management.request("PUT", f"/queues/{queue}", {"durable": False}).status == 201
    local = blocking_on(port, pids, pids[1])
    sender = local.create_sender(f"/queues/{drained}")
    # Above a holder's floor (a quarter of the 4 MiB margin): a publish to it parks.
    for _ in range(8):
        sender.send(proton.Message(body=BODY))
    filler = blocking_on(port, pids, pids[1])
    assert _held_after(filler.create_sender(f"/queues/{heavy}")) > 0
    remote = blocking_on(port, pids, pids[0])
    parked = remote.create_sender(f"/queues/{drained}")
    confirmed = threading.Event()

    def publish() -> None:
        parked.send(proton.Message(body="parked"), timeout=60)
        confirmed.set()

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    assert not confirmed.wait(3), "parked while its queue weighs a holder's"
    reader = blocking_on(port, pids, pids[1])
    receiver = reader.create_receiver(f"/queues/{drained}", credit=20)
    for _ in range(8):
        receiver.receive(timeout=10)
        receiver.accept()
    assert budget_used(data_dir, 1) >= LIMIT * 0.8, "worker 1 is still blocked"
    # Before: parked until worker 1 let go, which the heavy queue nobody reads never allows.
    assert confirmed.wait(15)
    assert receiver.receive(timeout=10).body == "parked"
    receiver.accept()
    for connection in (reader, remote, local):
        connection.close()
    del filler  # held: its close would wait for the hold


@pytest.mark.slow
def test_consumers_waiting_on_empty_queues_across_leave_the_imports_part_to_one_with_messages(
    two_workers: tuple[int, list[int], Path],
) -> None:
    """Consumers on a blocked worker waiting with credit on empty queues of the other worker
    hold reservations, not bytes: a fresh link is reserved a whole batch for its first
    delivery, so two of them took the imports' part, and a consumer of a queue there with
    messages waiting got none while the budget stayed blocked."""
    port, pids, data_dir = two_workers
    management = ManagementClient(f"amqp://127.0.0.1:{port}")
    heavy, light = homed_on(1, 2, "idle-heavy"), homed_on(0, 2, "idle-light")
    empties = [homed_on(0, 2, f"idle-empty{n}") for n in range(IDLE)]
    for queue in (heavy, light, *empties):
        assert management.request("PUT", f"/queues/{queue}", {"durable": False}).status == 201
    filler = blocking_on(port, pids, pids[1])
    assert _held_after(filler.create_sender(f"/queues/{heavy}")) > 0
    assert budget_used(data_dir, 1) >= LIMIT
    idle = [blocking_on(port, pids, pids[1]) for _ in empties]
    owner = blocking_on(port, pids, pids[0])
    try:
        for connection, queue in zip(idle, empties, strict=True):
            connection.create_receiver(f"/queues/{queue}", credit=100)
        time.sleep(0.5)
        sender = owner.create_sender(f"/queues/{light}")
        for n in range(LIGHT):
            sender.send(proton.Message(body=f"light {n}"))
        _consume_light(port, pids, light)
    finally:
        for connection in idle:
            connection.close()
        owner.close()
        del filler  # held: its close would wait for the hold
