"""The server's queues that have something to time, by when it is due.

A queue joins (:meth:`TimedQueues.add`) whenever one of its deadlines may have come earlier: a
message that expires, a delivery lock, a paused walk, a dead letter's next try. Kept as a set,
the timer read every one's next deadline twice a tick, 20 times a second: 10,000 queues each
with a message of a day's TTL took 19 ms a tick, some 40 % of the reactor, for as long as they
stayed. Here they wait in a heap by deadline, so a tick costs the queues due and a look at the
earliest. The heap is lazy: an entry the queue's later registration replaced, or a queue that
left, is dropped when met.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from sluicegate.queues.queue_type import QueueType


class TimedQueues:
    """Queues with deadlines pending, each registered at its earliest."""

    __slots__ = ("_at", "_heap", "_tickets")

    def __init__(self) -> None:
        # Each queue's deadline as registered, and (deadline, ticket, queue) entries by it.
        self._at: dict[QueueType, int] = {}
        self._heap: list[tuple[int, int, QueueType]] = []
        self._tickets = 0

    def add(self, queue: QueueType, at: int | None = None) -> None:
        """One of ``queue``'s deadlines may have come earlier (``at``, if the caller knows it:
        nothing to do when the queue is registered no later, the common case of a message or
        a lock behind others)."""
        registered = self._at.get(queue)
        if at is not None and registered is not None and registered <= at:
            return
        deadline = queue.next_deadline()
        if deadline is None or (registered is not None and registered <= deadline):
            return
        self._at[queue] = deadline
        self._tickets += 1
        heapq.heappush(self._heap, (deadline, self._tickets, queue))

    def discard(self, queue: QueueType) -> None:
        """``queue`` has nothing to time, or is gone."""
        self._at.pop(queue, None)

    def due(self, now: int) -> list[QueueType]:
        """The queues registered at ``now`` or earlier, taken out: each joins again, at its
        next deadline, once its expiry ran (:meth:`add`)."""
        heap, at = self._heap, self._at
        due: list[QueueType] = []
        while heap and heap[0][0] <= now:
            deadline, _, queue = heapq.heappop(heap)
            if at.get(queue) == deadline:
                del at[queue]
                due.append(queue)
        return due

    def next_deadline(self) -> int | None:
        """The earliest registered deadline."""
        heap, at = self._heap, self._at
        while heap:
            deadline, _, queue = heap[0]
            if at.get(queue) == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def __iter__(self) -> Iterator[QueueType]:
        return iter(list(self._at))

    def __len__(self) -> int:
        return len(self._at)
