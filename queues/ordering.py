"""The order a classic queue serves its available messages in: publication order, or priority.

A :class:`Cursor` serves in publication order: it marks how far the queue has handed out
messages, and a message released behind it waits in a heap by sequence number and is served
before the cursor moves on, so it goes back to its original position. Filtered and browsing
consumers each walk with a cursor of their own, since they skip what they do not match. A
priority queue (``x-max-priority``) serves from :class:`PriorityLanes` instead: one lane of
sequence numbers per priority, highest first.

Both leave it to the queue's :meth:`~queues.backlog.Backlog.collect` to skip what is no longer
available and expire the dead. Heaps and lanes are lazy: an entry whose message changed state
meanwhile is dropped when met, or by a compaction once they have grown past twice what was live
(queues/compaction.py).

Messages released behind filtered walks go into one :class:`ReleasedLog` per queue, which each
filtered walk reads from where it last read, a step of its budget per entry: a release costs
one append however many filtered consumers the queue has. Before, each of their heaps took it,
so one DISPOSITION releasing 1,000 messages of a queue with 200 filtered consumers that had no
credit pushed 200,000 entries, none of which they ever met (docs/bounds.md).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Final, Protocol

from sluicegate.queues.backlog import Backlog
from sluicegate.queues.compaction import COMPACT_SLACK, compact
from sluicegate.queues.filters.budget import ReadBudget
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import AVAILABLE, Message
from sluicegate.queues.queue_type import MessageFilter

_NO_LANE: Final[deque[int]] = deque()
# Releases a queue's log keeps for its filtered walks: past it, the older half goes and the walks
# that had not read it move back to the lowest message in it (a trim visits every filtered
# walk, once per this many releases over two).
RELEASED_LOG_MAX: Final = 4096


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

    __slots__ = (
        "accept",
        "backlog",
        "browse",
        "budget",
        "position",
        "released",
        "returned",
        "returned_limit",
        "seen",
        "views",
    )

    def __init__(
        self,
        backlog: Backlog,
        position: int,
        accept: MessageFilter | None = None,
        browse: bool = False,
        budget: ReadBudget | None = None,
        views: ViewCache | None = None,
        released: ReleasedLog | None = None,
    ) -> None:
        self.backlog = backlog
        # The next sequence number to look at.
        self.position = position
        self.returned: list[int] = []
        self.returned_limit = COMPACT_SLACK
        # A filtered consumer's filter; a browser also sees messages others hold.
        self.accept = accept
        self.browse = browse
        self.budget = budget
        self.views = views
        # A filtered walk's log of releases, and how far in it the walk has read.
        self.released = released
        self.seen = 0
        if released is not None:
            released.join(self)

    def take(self, limit: int, now: int, taken: list[Message]) -> None:
        """The released messages first, then on from the cursor, paging in at the end."""
        if len(taken) >= limit:
            return
        backlog = self.backlog
        accept = self.accept
        budget = self.budget
        views = self.views
        released = self.released
        if released is not None and self.seen < released.end:
            self._absorb(released)
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
            self._behind(seq)

    def _behind(self, seq: int) -> None:
        returned = self.returned
        heapq.heappush(returned, seq)
        if len(returned) > self.returned_limit:
            self.returned_limit = compact(returned, self.backlog.available)

    def _absorb(self, log: ReleasedLog) -> None:
        """Read the releases logged since this walk last read, a step of its budget each:
        those behind it are served before it moves on."""
        seqs = log.seqs
        start = self.seen - log.base
        end = len(seqs)
        budget = self.budget
        if budget is not None:
            end = min(end, start + max(budget.units, 0))
            budget.units -= end - start
        position = self.position
        for seq in seqs[start:end]:
            if seq < position:
                self._behind(seq)
        self.seen = log.base + end

    def fell_behind(self, base: int, lowest: int) -> None:
        """The log dropped releases up to ``base`` (the lowest of them ``lowest``): a walk that
        had not read them all goes back to ``lowest``, to meet them on its way again."""
        if self.seen < base:
            self.seen = base
            self.position = min(self.position, lowest)

    def clear(self) -> None:
        """Forget the released messages."""
        self.returned.clear()
        released = self.released
        if released is not None:
            self.seen = released.end


class ReleasedLog:
    """The messages released back into a queue, in the order they came back, for every
    filtered walk to read from where it last read (:meth:`Cursor.take`)."""

    __slots__ = ("base", "readers", "seqs")

    def __init__(self) -> None:
        # The position in the log of ``seqs[0]``.
        self.base = 0
        self.seqs: list[int] = []
        # The walks reading it: a dict, so that one ends in O(1) however many there are.
        self.readers: dict[Cursor, None] = {}

    @property
    def end(self) -> int:
        """The position after the last release logged."""
        return self.base + len(self.seqs)

    def join(self, cursor: Cursor) -> None:
        """A filtered walk begins: it reads the releases logged from now on."""
        cursor.seen = self.end
        self.readers[cursor] = None

    def clear(self) -> None:
        """The queue was purged: nothing released is left to meet."""
        self.base = self.end
        self.seqs.clear()
        for cursor in self.readers:
            cursor.clear()

    def leave(self, cursor: Cursor) -> None:
        """A filtered walk ended; with none left, nothing is kept."""
        del self.readers[cursor]
        if not self.readers:
            self.base = self.end
            self.seqs.clear()

    def add(self, seq: int) -> None:
        """A message is available again; past :data:`RELEASED_LOG_MAX`, the older half goes."""
        if not self.readers:
            return
        seqs = self.seqs
        seqs.append(seq)
        if len(seqs) > RELEASED_LOG_MAX:
            cut = len(seqs) // 2
            lowest = min(seqs[:cut])
            del seqs[:cut]
            self.base += cut
            for cursor in self.readers:
                cursor.fell_behind(self.base, lowest)


class PriorityLanes:
    """Available messages by priority, highest first, in publication order within one.

    A lane may still name a message taken by a filtered consumer or a browser (they walk in
    publication order), expired or archived since: such entries are dropped when met.
    """

    __slots__ = ("backlog", "entries", "lanes", "limit", "returned")

    def __init__(self, backlog: Backlog, max_priority: int) -> None:
        self.backlog = backlog
        self.lanes: list[deque[int]] = [deque() for _ in range(max_priority + 1)]
        # Per priority, a heap of those released back, served first in their lane.
        self.returned: list[list[int]] = [[] for _ in range(max_priority + 1)]
        # Entries added to lanes and heaps since their last compaction, and what they held
        # then (those met since are not counted off); past ``limit``, they are compacted.
        self.entries = 0
        self.limit = COMPACT_SLACK

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
            self._grown()

    def requeue(self, message: Message) -> None:
        """A released message is served first in its lane, by sequence number."""
        heapq.heappush(self.returned[message.priority], message.seq)
        self._grown()

    def _grown(self) -> None:
        """An entry was added: past the limit, every lane and heap keeps only what is live
        (a lane's entries taken by filtered consumers and browsers stay until a consumer
        taking in order meets them, and a queue may have none)."""
        self.entries += 1
        if self.entries <= self.limit:
            return
        available = self.backlog.available
        for lane in self.lanes:
            kept = [seq for seq in lane if available(seq)]
            lane.clear()
            lane.extend(kept)
        for heap in self.returned:
            compact(heap, available)
        self.entries = sum(map(len, self.lanes)) + sum(map(len, self.returned))
        self.limit = 2 * self.entries + COMPACT_SLACK

    def clear(self) -> None:
        """Empty every lane."""
        for lane in self.lanes:
            lane.clear()
        for returned in self.returned:
            returned.clear()
        self.entries = 0


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
