"""The order a classic queue serves its available messages in: publication order, or priority.

A :class:`Cursor` serves in publication order: it marks how far the queue has handed out
messages, and a message released behind it waits in a heap by sequence number and is served
before the cursor moves on, so it goes back to its original position. Filtered and browsing
consumers each walk with a cursor of their own, since they skip what they do not match. A
priority queue (``x-max-priority``) serves from :class:`PriorityLanes` instead: one lane of
sequence numbers per priority, highest first.

Both leave it to the queue's :meth:`~queues.backlog.Backlog.collect` to skip what is no longer
available and expire the dead. Heaps and lanes are lazy: an entry whose message changed state
meanwhile is dropped when met.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Final, Protocol

from sluicegate.queues.backlog import Backlog
from sluicegate.queues.filters.budget import ReadBudget
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import AVAILABLE, Message
from sluicegate.queues.queue_type import MessageFilter

_NO_LANE: Final[deque[int]] = deque()


class Ordering(Protocol):
    """How a queue picks the available messages to serve to consumers that take them in order."""

    def take(self, limit: int, now: int, taken: list[Message]) -> None:
        """Append up to ``limit`` messages to serve, in order, to ``taken``; each at most once."""

    def next(self, now: int) -> Message | None:
        """The next message to serve, or None when none is available."""

    def add(self, message: Message) -> None:
        """A new message joined the queue, and was perhaps offered to a consumer at once."""

    def requeue(self, message: Message) -> None:
        """An acquired message is available again: it goes back to its original position."""

    def clear(self) -> None:
        """Forget every available message (the queue purged them)."""


class Cursor:
    """A walk over a queue's messages in publication order, with those released behind it.

    A filtered walk charges its filter's work to the queue's ``budget`` and stops where it is
    when that is spent (queues.filters.budget).
    """

    __slots__ = ("accept", "backlog", "browse", "budget", "position", "returned", "views")

    def __init__(
        self,
        backlog: Backlog,
        position: int,
        accept: MessageFilter | None = None,
        browse: bool = False,
        budget: ReadBudget | None = None,
        views: ViewCache | None = None,
    ) -> None:
        self.backlog = backlog
        # The next sequence number to look at.
        self.position = position
        self.returned: list[int] = []
        # A filtered consumer's filter; a browser also sees messages others hold.
        self.accept = accept
        self.browse = browse
        self.budget = budget
        self.views = views

    def take(self, limit: int, now: int, taken: list[Message]) -> None:
        """The released messages first, then on from the cursor, paging in at the end."""
        if len(taken) >= limit:
            return
        backlog = self.backlog
        accept = self.accept
        budget = self.budget
        views = self.views
        if self.returned:
            returned = _merged(_NO_LANE, self.returned)
            backlog.collect(returned, now, limit, taken, accept, False, budget, views)
            if len(taken) >= limit or (budget is not None and budget.spent):
                return
        seq = max(self.position, backlog.low)
        while True:
            end = backlog.next_seq
            stop = backlog.collect(
                range(seq, end), now, limit, taken, accept, self.browse, budget, views
            )
            if stop is not None:
                self.position = stop
                return
            seq = end
            if not backlog.pages:
                break
            backlog.page_in()
        self.position = seq

    def next(self, now: int) -> Message | None:
        """The next message to serve, moving the cursor past it."""
        taken: list[Message] = []
        self.take(1, now, taken)
        return taken[0] if taken else None

    def add(self, message: Message) -> None:
        """Nothing to do: a new message is at the end of the walk already."""

    def requeue(self, message: Message) -> None:
        """A message released behind the cursor is served before the cursor moves on."""
        seq = message.seq
        if seq < self.position:
            heapq.heappush(self.returned, seq)

    def clear(self) -> None:
        """Forget the released messages."""
        self.returned.clear()


class PriorityLanes:
    """Available messages by priority, highest first, in publication order within one.

    A lane may still name a message taken by a filtered consumer or a browser (they walk in
    publication order), expired or archived since: such entries are dropped when met.
    """

    __slots__ = ("backlog", "lanes", "returned")

    def __init__(self, backlog: Backlog, max_priority: int) -> None:
        self.backlog = backlog
        self.lanes: list[deque[int]] = [deque() for _ in range(max_priority + 1)]
        # Per priority, a heap of those released back, served first in their lane.
        self.returned: list[list[int]] = [[] for _ in range(max_priority + 1)]

    def take(self, limit: int, now: int, taken: list[Message]) -> None:
        """The oldest available messages of the highest priority that has any, and so on."""
        collect = self.backlog.collect
        for priority in range(len(self.lanes) - 1, -1, -1):
            if len(taken) >= limit:
                return
            collect(_merged(self.lanes[priority], self.returned[priority]), now, limit, taken)

    def next(self, now: int) -> Message | None:
        """The next message to serve."""
        taken: list[Message] = []
        self.take(1, now, taken)
        return taken[0] if taken else None

    def add(self, message: Message) -> None:
        """Read the header's priority (AMQP's default is 4; above x-max-priority counts as it);
        a message still available joins its lane."""
        message.priority = min(message.read_header().priority, len(self.lanes) - 1)
        if message.state == AVAILABLE:
            self.lanes[message.priority].append(message.seq)

    def requeue(self, message: Message) -> None:
        """A released message is served first in its lane, by sequence number."""
        heapq.heappush(self.returned[message.priority], message.seq)

    def clear(self) -> None:
        """Empty every lane."""
        for lane in self.lanes:
            lane.clear()
        for returned in self.returned:
            returned.clear()


def _merged(lane: deque[int], returned: list[int]) -> Iterator[int]:
    """Sequence numbers from a lane and a heap of released ones, smallest first, each once.

    Entries are taken only as the walk asks for them: what it does not reach stays. A number
    may be in both, or twice in the heap (released again before its stale entry was met).
    """
    while returned or lane:
        if returned and (not lane or returned[0] <= lane[0]):
            seq = heapq.heappop(returned)
            if lane and lane[0] == seq:
                lane.popleft()
        else:
            seq = lane.popleft()
        while returned and returned[0] == seq:
            heapq.heappop(returned)
        yield seq
