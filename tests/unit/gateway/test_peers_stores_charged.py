"""How a blocked owner stores another worker's parked publishes to light queues (gateway/
peers.py's ``_store_light``): what it stores between two flushes is charged to its budget at
once, as a read of its own publishers is, and a walk that stored nothing is not done again
until something changes. Worker 1 in a real reactor, the test writing worker 0's frames."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.worker_one import confirms, parked, publish_frame, weights_read, worker_one

from sluicegate.queues.message import Message
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


def test_a_walk_that_stored_nothing_is_not_walked_again_until_something_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Walked at every flush while blocked, 4,800 parked publishes took 3 ms a flush whatever
    brought it (a `/tmp` script on this harness), though a walk that stored nothing stores
    nothing again until the room grows, a publish is parked, or the holds are decided."""
    budget = MemoryBudget(LIMIT)
    read = weights_read(monkeypatch)
    with worker_one(tmp_path, budget) as worker:
        heavy = worker.registry.declare_queue("heavy")
        for _ in range(3):
            heavy.enqueue(Message(RUN))
        worker.registry.declare_queue("light")
        budget.keep_for_letters(1)
        budget.update(LIMIT + 1)
        worker.peers.flush(budget)
        parked(worker, [publish_frame(1, "heavy", [RUN], LIGHT_PUBLISHER)])
        worker.peers.flush(budget)
        assert "heavy" in read, "walked: the heavy queue's publish waits"
        read.clear()
        for _ in range(5):
            worker.peers.flush(budget)
        assert read == []
        parked(worker, [publish_frame(2, "light", [RUN], LIGHT_PUBLISHER)])
        worker.peers.flush(budget)
        assert confirms(worker, FrameReader(1 << 21), 1) == {2: Settled.ACCEPTED}
