"""An owner that is not blocked stores another worker's runs only as far as its limit
(gateway/peers.py's ``_split``): the rest of a run waits parked, in order, and is stored once
there is room. A run holds what one publisher sent in a pass, up to the largest message; stored
whole on the last byte of room, it took the owner its size past the limit. Worker 1 in a real
reactor, the test writing worker 0's frames."""

from __future__ import annotations

from pathlib import Path

from support.worker_one import confirms, parked, publish_frame, worker_one

from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.session.channel.codec import FrameReader
from sluicegate.session.channel.frames import Settled
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp

LIMIT = 8 * 1024 * 1024
# Room left below the limit when the run comes: less than one of its messages.
ROOM = 5_000
# Ten messages of 10 KB in one run: within what the test's socket pair holds unread.
COPIES = 10
PUBLISHER = 4


def _payload(index: int) -> bytes:
    return amqp(Described(0x75, index.to_bytes(4, "big") * 2_500))


def test_a_run_that_comes_while_not_blocked_is_stored_as_far_as_the_limit_the_rest_in_order(
    tmp_path: Path,
) -> None:
    budget = MemoryBudget(LIMIT)
    payloads = [_payload(index) for index in range(COPIES)]
    reader = FrameReader(1 << 24)
    with worker_one(tmp_path, budget) as worker:
        queue = worker.registry.declare_queue("wide")
        budget.update(LIMIT - ROOM)
        assert not budget.blocked
        worker.peers.flush(budget)
        # 100 KB in one run against 5 KB of room: the first message is stored (a message
        # larger than the room still goes), the other nine wait, parked as one run.
        parked(worker, [publish_frame(1, "wide", payloads, PUBLISHER)])
        assert queue.statistics().ready == 1
        assert [len(publish.payloads) for _, publish in worker.peers._parked] == [COPIES - 1]
        # With room at the next flush, the rest goes in order, each confirmed once.
        budget.update(0)
        worker.peers.flush(budget)
        accepted = dict.fromkeys(range(1, COPIES + 1), Settled.ACCEPTED)
        assert confirms(worker, reader, COPIES) == accepted
        assert not worker.peers._parked
        queue.attach("reader", ack_required=False)
        delivered, _ = queue.credit("reader", 0, COPIES + 1, False)
        assert [message.payload for message in delivered] == payloads


def test_parked_runs_are_stored_at_the_flush_as_far_as_the_limit(tmp_path: Path) -> None:
    """Parked while blocked, then stored once the budget lets go: whole runs went while any
    room was left, the last one past the limit by up to its size; now a run is cut where the
    room ends, and its rest waits at the head of the parked, in order."""
    budget = MemoryBudget(LIMIT)
    payloads = [_payload(index) for index in range(COPIES)]
    runs = 20
    with worker_one(tmp_path, budget) as worker:
        queue = worker.registry.declare_queue("heavy")
        # Heavy, so that nothing is stored for it while blocked (a light queue's runs are).
        for _ in range(30):
            queue.enqueue(Message(payloads[0]))
        budget.update(LIMIT + 1)
        worker.peers.flush(budget)
        parked(
            worker,
            [publish_frame(1 + run * COPIES, "heavy", payloads, PUBLISHER) for run in range(runs)],
        )
        budget.update(budget.resume_at)
        room = LIMIT - budget.resume_at
        size = len(payloads[0]) + MESSAGE_OVERHEAD
        worker.peers.flush(budget)
        stored = queue.statistics().ready - 30
        assert stored == room // size
        left = [len(publish.payloads) for _, publish in worker.peers._parked]
        assert sum(left) == runs * COPIES - stored
        # The rest of the run cut first, at the head.
        assert left[0] == COPIES - stored % COPIES
