"""A worker whose memory budget is blocked still serves the other workers' clients of its queues.

Adversary seeds 31100 to 31104 (docs/adversary.md): a worker whose budget was blocked stopped
reading its channels, so a consumer on the other worker of its full queue was never answered
and the worker stayed blocked for good. Its channels are read now; only the other workers'
publishes to the queues that hold the budget wait (gateway/peers.py parks them), as its own
publishers to them do. Once drained, they are stored and confirmed, in order.
"""

from __future__ import annotations

import pytest
from proton import Message, Timeout
from proton.utils import BlockingSender, SendException
from support.process import serving
from support.workers import blocking_on, children, homed_on, worker_of

pytestmark = pytest.mark.slow

BODY = 100_000
# Worker 1's share of it is 16 MiB: a hundred and some messages of 100 KB fill it.
BUDGET = "32MiB"


def test_a_consumer_on_another_worker_drains_a_queue_whose_worker_is_blocked() -> None:
    with serving(
        "--workers",
        "2",
        "--worker-handover",
        "false",
        "--memory-budget",
        BUDGET,
        "--metrics-listen",
        "off",
    ) as (
        process,
        port,
    ):
        pids = sorted(children(process.pid), key=worker_of)
        full = homed_on(1, 2, "full")
        light = homed_on(1, 2, "light")
        filler = blocking_on(port, pids, pids[1])
        sender = filler.create_sender(full)
        stored = _fill(sender)
        assert stored > 100

        far = blocking_on(port, pids, pids[0])
        # A publish from worker 0 to a queue that holds nothing is stored and settled.
        far.create_sender(light).send(Message(body="p"), timeout=10)
        # One to the full queue waits, its settlement with it, until the queue drains.
        parked = far.create_sender(full)
        with pytest.raises(Timeout):
            parked.send(Message(body="after"), timeout=2)

        consumer = blocking_on(port, pids, pids[0])
        receiver = consumer.create_receiver(full, credit=50)
        bodies = []
        while "after" not in bodies:
            bodies.append(receiver.receive(timeout=30).body)
            receiver.accept()
        # Every message stored before, then the parked publish once worker 1's budget let go
        # (the filler's last, unsettled when it was held, may come just before or after it).
        assert bodies[:stored] == ["x" * BODY] * stored
        assert len(bodies) in (stored + 1, stored + 2)
        light_receiver = consumer.create_receiver(light, credit=1)
        assert light_receiver.receive(timeout=10).body == "p"
        light_receiver.accept()
        for connection in (filler, far, consumer):
            connection.close()


def _fill(sender: BlockingSender) -> int:
    """Send until worker 1's budget holds the sender (its settlement never comes): how many
    were settled."""
    stored = 0
    while True:
        try:
            sender.send(Message(body="x" * BODY), timeout=3)
        except (Timeout, SendException):
            return stored
        stored += 1
