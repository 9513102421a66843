"""A fan-out's copies from another worker are charged to the link they were published on, so
the owner holds that link, not its light publishers (issue 31, adversary seeds 66102 and
66103, session/remote_publishers.py).

Worker 1's limit is held by a queue nobody reads, its publisher held. A publisher on worker 0
then sends to a fanout of many queues on worker 1: each copy crosses, and each queue stays far
under a holder's floor. Weighed per queue, nobody was held for them: they took worker 1's
publishers' whole part, where every publisher waits, and worker 1's light prober waited with
them for as long as the budget stayed blocked. The owner now charges what the copies store to
the link behind them, holds it by the rule its own publishers are held by, and parks its
publishes, as many as its parked window keeps, giving the rest back; the prober goes on within
the part, and once the budget lets go every parked copy is stored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, BlockingSender
from support.polling import wait_until
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
# Each worker's share of a 32 MiB budget over two, its margin (an eighth), and where its
# publishers wait: the limit and half the margin, the rest kept for letters, imports and
# deliveries still arriving (session/memory_budget.py).
LIMIT: Final = 16 * MiB
PUBLISHING_CEILING: Final = LIMIT + LIMIT // 8 // 2
FILL: Final = b"f" * 100_000
# The fanout's queues on worker 1, and what is published to it: 20 messages of 10 KB, 6 MB of
# copies on worker 1, six times the publishers' part, each queue's 200 KB under a holder's
# floor (a quarter of the margin, 512 KiB).
FAN: Final = 30
FANNED: Final = 20
BODY: Final = "c" * 10_000
# Seconds the prober's publish may wait for its settlement: before, it waited for good.
PROBE_TIMEOUT: Final = 20


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    with metered_workers(tmp_path, "32MiB") as (port, pids):
        yield port, pids, tmp_path


def _fan_out(connection: BlockingConnection, sender: BlockingSender) -> None:
    """Send :data:`FANNED` messages on the credit granted, settled or not, and let the
    connection write them."""
    sent = 0
    deadline = time.monotonic() + 60
    while sent < FANNED and time.monotonic() < deadline:
        while sender.link.credit > 0 and sent < FANNED:
            sender.link.send(Message(body=BODY))
            sent += 1
        with contextlib.suppress(Timeout):
            connection.wait(lambda: False, timeout=0.2)
    assert sent == FANNED, f"only {sent} of the fan-out's messages got credit"


def _count(management: ManagementClient, queue: str) -> int:
    """How many messages ``queue`` holds, as its worker says."""
    reply = management.request("GET", f"/queues/{queue}")
    assert reply.status == 200
    assert isinstance(reply.body, dict)
    return int(reply.body["message_count"])


def _settled(data_dir: Path, connection: BlockingConnection) -> float:
    """Worker 1's publishing level once it stops moving."""
    last = -1.0
    while True:
        with contextlib.suppress(Timeout):
            connection.wait(lambda: False, timeout=1)
        level = own_sample(data_dir, 1, "sluicegate_memory_budget_publishing_level_bytes")
        if level == last:
            return level
        last = level


@pytest.mark.slow
def test_a_fan_out_from_another_worker_holds_its_publisher_and_not_the_light_ones(
    two_workers: tuple[int, list[int], Path],
) -> None:
    port, pids, data_dir = two_workers
    full, probed = homed_on(1, 2, "charged-full"), homed_on(1, 2, "charged-probe")
    fan = [homed_on(1, 2, f"charged-fan{n}") for n in range(FAN)]
    management = connection_on(
        port,
        pids,
        pids[1],
        lambda: ManagementClient(f"amqp://127.0.0.1:{port}"),
        ManagementClient.close,
    )
    exchange = {"type": "fanout", "durable": False, "internal": False, "arguments": {}}
    assert management.request("PUT", "/exchanges/charged", exchange).status == 204
    for name in (full, probed, *fan):
        assert management.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
    for name in fan:
        binding = {"source": "charged", "destination_queue": name, "arguments": {}}
        assert management.request("POST", "/bindings", binding).status == 204
    # The prober's link is attached while worker 1 has room: one attached while it is blocked
    # is granted its credit only by a renewal.
    prober = blocking_on(port, pids, pids[1])
    filler = blocking_on(port, pids, pids[1])
    far = blocking_on(port, pids, pids[0])
    try:
        probe = prober.create_sender(f"/queues/{probed}")
        probe.send(Message(body="before"), timeout=PROBE_TIMEOUT)
        assert send_until_held(filler.create_sender(f"/queues/{full}"), FILL) > 0
        assert own_sample(data_dir, 1, "sluicegate_memory_budget_blocked") == 1
        _fan_out(far, far.create_sender("/exchanges/charged"))
        level = _settled(data_dir, far)
        # Before: the copies took the part to its ceiling (17.91 MB against 17.83 MB, in 30
        # queues far under the floor, nobody held) and the prober's publish waited for good;
        # after: the fan-out's link held at 17.27 MB.
        assert level < PUBLISHING_CEILING, f"worker 1's publishers' level {level:.0f}"
        probe.send(Message(body="while blocked"), timeout=PROBE_TIMEOUT)
        # Drained, worker 1 lets go and stores every parked copy (the filler's connection is
        # held, not read: a reader of its own).
        consumer = blocking_on(port, pids, pids[1])
        assert drained(consumer, full, 50) > 0
        consumer.close()
        # Worker 1 kept a window of the copies parked and gave the rest back released
        # (gateway/peers.py's ``_give_back``): none is lost unseen.
        given_back = "sluicegate_memory_budget_channel_given_back_total"
        wait_until(
            lambda: (
                sum(_count(management, name) for name in fan) + own_sample(data_dir, 1, given_back)
                == FAN * FANNED
            ),
            timeout=60,
        )
    finally:
        for connection in (prober, filler, far):
            connection.close()
        management.close()
