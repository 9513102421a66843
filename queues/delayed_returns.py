"""A quorum queue's delayed returns: messages a consumer gave back for a later delivery time.

RabbitMQ 4.3's delayed retry: a ``modified`` outcome whose annotations carry
``x-opt-delivery-time`` (wire/delivery_time.py) puts the message back in its quorum queue, but
not in reach of consumers before that time. The message stays in the queue's backlog, its
bytes counted as before, in state ``DELAYED`` (so no walk, filtered or not, hands it out);
here each waits in a heap by due time, every entry charged :data:`DELAYED_OVERHEAD` to the
server's count of held bytes, which the memory budget reads. How many can wait is bounded by
the queue's messages themselves: only a message a consumer held can be delayed, once.

The delay lives in memory: after a restart a delayed message of the durable log is available
at once, as its ``modified`` annotations are gone (queues/log/stored.py keeps them in memory
only).
"""

from __future__ import annotations

import heapq
from typing import Final

from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.message import AVAILABLE, DELAYED, Message

# What one delayed message costs beyond its own bytes, which the held count has already: its
# heap entry (a 3-tuple, 64 bytes, and the int of its due time, 32) and the heap list's slot
# (8), rounded up.
DELAYED_OVERHEAD: Final = 128


class DelayedReturns:
    """The messages of one queue that wait for their delivery time, earliest first."""

    __slots__ = ("_heap", "held")

    def __init__(self, held: HeldBytes) -> None:
        self.held = held
        # (due time in ms since the epoch, sequence number, message): the sequence number
        # keeps entries comparable and equal due times in queue order.
        self._heap: list[tuple[int, int, Message]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, message: Message, due: int) -> None:
        """Keep an available message out of reach until ``due``."""
        message.state = DELAYED
        heapq.heappush(self._heap, (due, message.seq, message))
        self.held.total += DELAYED_OVERHEAD

    def due(self, now: int) -> list[Message]:
        """The messages whose time came at ``now``, earliest first, set available again
        (their release was logged when they were held back), and no longer held here.

        One that left the queue meanwhile (purged, deleted) is dropped when met.
        """
        heap = self._heap
        ready: list[Message] = []
        while heap and heap[0][0] <= now:
            _, _, message = heapq.heappop(heap)
            self.held.total -= DELAYED_OVERHEAD
            if message.state == DELAYED:
                message.state = AVAILABLE
                ready.append(message)
        return ready

    def next_deadline(self) -> int | None:
        """When the earliest delayed message is due, if any waits."""
        heap = self._heap
        return heap[0][0] if heap else None

    def clear(self) -> int:
        """Forget every delayed message (its queue was purged or deleted): how many waited."""
        count = len(self._heap)
        self.held.total -= count * DELAYED_OVERHEAD
        self._heap.clear()
        return count
