"""What a blocked owner stores of another worker's parked publishes between two flushes is
charged to its budget at once (gateway/peers.py's ``_store``), as a read of its own publishers
is: worker 1 in a real reactor, the test writing worker 0's frames."""

from __future__ import annotations

from pathlib import Path

from support.worker_one import confirms, parked, publish_frame, worker_one

from sluicegate.session.channel.codec import FrameReader
from sluicegate.session.channel.frames import Settled
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp

# Worker 1's limit: a margin of 1 MiB, of which its publishers' part is 512 KiB (one peer).
LIMIT = 8 * 1024 * 1024
# A light run: within a quarter of the publishers' part, so admitted alone.
RUN = amqp(Described(0x75, b"x" * 100_000))
LIGHT_PUBLISHER = 4


def test_a_light_run_stored_after_the_flush_is_in_the_budget_before_the_next(
    tmp_path: Path,
) -> None:
    """The owner stored worker 0's light runs after the flush that decided who waits and
    renewed its own publishers' credit, and nothing counted them until the next: one pass's
    reads of its own light publishers could take the room they had taken, again, past its
    publishers' ceiling, where every publisher waits for as long as queues nobody reads hold
    it (the likeliest path to adversary seed 65854's worker 1, 187 KB past that ceiling with
    its prober waiting)."""
    budget = MemoryBudget(LIMIT)
    with worker_one(tmp_path, budget) as worker:
        worker.registry.declare_queue("light")
        budget.keep_for_letters(1)
        budget.update(LIMIT + 1)
        assert budget.blocked
        worker.peers.flush(budget)  # worker 1 parks what comes while blocked
        parked(worker, [publish_frame(1, "light", [RUN], LIGHT_PUBLISHER)])
        before = budget.publishing_level(budget.current)
        worker.peers.flush(budget)
        assert confirms(worker, FrameReader(1 << 21), 1) == {1: Settled.ACCEPTED}
        stored = worker.registry.queue("light").statistics().ready_bytes
        assert stored >= len(RUN)
        # Before the next flush counts the queue, what a read of worker 1's own publishers
        # is weighed against already holds the run.
        assert budget.publishing_level(budget.current) >= before + stored
