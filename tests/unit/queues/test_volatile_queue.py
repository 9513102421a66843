"""A Direct Reply-To queue drops what its requester cannot take: without credit, or backlogged."""

from __future__ import annotations

from sluicegate.queues.message import Message
from sluicegate.queues.volatile import VolatileQueue


def _requester(credit: int) -> VolatileQueue:
    queue = VolatileQueue()
    queue.attach("requester", ack_required=False)
    queue.credit("requester", 0, credit, False)
    return queue


def test_a_backlogged_requester_loses_replies_not_credit() -> None:
    queue = _requester(credit=10)
    backlogged = [False]
    queue.backlogged = lambda: backlogged[0]
    assert len(queue.enqueue(Message(b"one"))) == 1
    backlogged[0] = True
    assert queue.enqueue(Message(b"two")) == []
    assert queue.enqueue(Message(b"three")) == []
    # Dropped replies spend no credit: once it has caught up, the next reply goes.
    assert queue.waiting_credit == 9
    backlogged[0] = False
    assert len(queue.enqueue(Message(b"four"))) == 1
    stats = queue.statistics()
    assert (stats.published, stats.delivered, stats.dropped) == (4, 2, 2)


def test_replies_without_credit_are_dropped_whatever_the_backlog() -> None:
    queue = _requester(credit=1)
    assert len(queue.enqueue(Message(b"one"))) == 1
    assert queue.enqueue(Message(b"two")) == []
    assert queue.statistics().dropped == 1
