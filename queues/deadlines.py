"""A classic queue's timers: when its messages expire and when delivery locks run out.

Expiry deadlines (``ttl``, ``absolute-expiry-time``, ``x-message-ttl``) and delivery locks
(``x-consumer-timeout``) sit in heaps that the queue's ``expire`` pops when the server's timer
runs. The heaps are lazy: an entry whose message changed since
(settled, redelivered, gone) is dropped when met, or by a compaction once the heap has grown
past twice what was live (queues/compaction.py); a lock's entry names its message by sequence
number, so that a settled message is not kept alive until its lock's deadline. A queue with
something to time joins the server's set of timed queues, so the timer visits only those.
"""

from __future__ import annotations

import heapq
import weakref
from typing import Final, Protocol

from sluicegate.queues.compaction import COMPACT_SLACK, compact
from sluicegate.queues.message import AVAILABLE, Message
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.timed_queues import TimedQueues

# Deliveries whose lock expired that a consumer may still settle late and get a clear error;
# older ones are forgotten (their late settlement is then ignored like any unknown one).
_MAX_LOST_LOCKS: Final = 65536


class LockHolder(Protocol):
    """A consumer as its locks see it: what it holds, and what it lost to lock expiry."""

    unacked: dict[int, Message]
    unacked_bytes: int
    lost: dict[int, None]


class Deadlines:
    """The expiry and lock deadlines of one queue."""

    __slots__ = (
        "expiries",
        "expiries_limit",
        "locks",
        "locks_limit",
        "messages",
        "owner",
        "tickets",
        "timed",
        "timeout",
        "ttl",
    )

    def __init__(
        self, owner: QueueType, timed: TimedQueues, ttl: int | None, timeout: int | None
    ) -> None:
        # Weakly: the queue owns its deadlines, and a reference back made every deleted queue
        # a cycle, kept with what it held until a collection.
        self.owner = weakref.ref(owner)
        # The server's queues that have deadlines: joined here, left when expire() runs dry.
        self.timed = timed
        # x-message-ttl and x-consumer-timeout, in milliseconds.
        self.ttl = ttl
        self.timeout = timeout
        # The queue's resident messages by sequence number (its backlog's, which sets it):
        # what a compaction asks whether an entry is live.
        self.messages: dict[int, Message] = {}
        # (deadline, sequence number) of messages that expire.
        self.expiries: list[tuple[int, int]] = []
        # (deadline, ticket, sequence number, holder): the ticket keeps entries comparable.
        self.locks: list[tuple[int, int, int, LockHolder]] = []
        self.tickets = 0
        # The lengths past which each heap is compacted.
        self.expiries_limit = self.locks_limit = COMPACT_SLACK

    def _queue(self) -> QueueType:
        owner = self.owner()
        assert owner is not None  # it owns these deadlines, which live only as long as it
        return owner

    def apply_ttl(self, message: Message, now: int) -> None:
        """Shorten a new message's expiry to the queue's x-message-ttl from ``now``."""
        if self.ttl is not None:
            deadline = now + self.ttl
            if message.expires is None or deadline < message.expires:
                message.expires = deadline

    def watch(self, message: Message, expires: int) -> None:
        """Expire the available message at ``expires`` (its expiry) unless it leaves before."""
        expiries = self.expiries
        heapq.heappush(expiries, (expires, message.seq))
        if len(expiries) > self.expiries_limit:
            self.expiries_limit = compact(expiries, self._expires)
        self.timed.add(self._queue(), expires)

    def _expires(self, entry: tuple[int, int]) -> bool:
        """Whether an expiry entry still names an available message that expires then."""
        deadline, seq = entry
        message = self.messages.get(seq)
        return message is not None and message.state == AVAILABLE and message.expires == deadline

    def lock(self, message: Message, holder: LockHolder, now: int) -> None:
        """Release the delivery back to the queue if ``holder`` has not settled it in time."""
        timeout = self.timeout
        if timeout is None:
            return
        deadline = message.lock_deadline = now + timeout
        self.tickets += 1
        locks = self.locks
        heapq.heappush(locks, (deadline, self.tickets, message.seq, holder))
        if len(locks) > self.locks_limit:
            self.locks_limit = _compact_locks(locks)
        self.timed.add(self._queue(), deadline)

    def join(self) -> None:
        """The queue has something to time besides its heaps (a page's head message)."""
        self.timed.add(self._queue())

    def due(self, now: int) -> list[tuple[int, int]]:
        """The expiries that are ``now`` or past: (deadline, sequence number) of each."""
        expiries = self.expiries
        due: list[tuple[int, int]] = []
        while expiries and expiries[0][0] <= now:
            due.append(heapq.heappop(expiries))
        return due

    def released(self, now: int) -> list[Message]:
        """The deliveries whose lock ran out: taken from their holders, remembered as lost.

        A holder that settles one later is told its settlement changed nothing.
        """
        locks = self.locks
        released: list[Message] = []
        while locks and locks[0][0] <= now:
            deadline, _, seq, holder = heapq.heappop(locks)
            message = holder.unacked.get(seq)
            if message is not None and message.lock_deadline == deadline:
                del holder.unacked[seq]
                holder.unacked_bytes -= message.held
                lost = holder.lost
                if len(lost) >= _MAX_LOST_LOCKS:
                    del lost[next(iter(lost))]
                lost[seq] = None
                released.append(message)
        return released

    def next_deadline(self, head: int | None) -> int | None:
        """The earliest deadline pending (perhaps of a message since gone), or ``head``'s."""
        deadlines = [] if head is None else [head]
        if self.expiries:
            deadlines.append(self.expiries[0][0])
        if self.locks:
            deadlines.append(self.locks[0][0])
        return min(deadlines) if deadlines else None

    def settle_timer(self, head: int | None) -> None:
        """Leave the server's timed queues when nothing is left to time."""
        if self.next_deadline(head) is None:
            self.timed.discard(self._queue())


def _compact_locks(locks: list[tuple[int, int, int, LockHolder]]) -> int:
    """:func:`~queues.compaction.compact` for the locks: of a holder's entries for one message,
    only the latest may be live (a release and a new delivery in the same millisecond give the
    same deadline), and it is while the holder holds the message under that deadline."""
    latest: dict[tuple[int, int], tuple[int, int, int, LockHolder]] = {}
    for entry in locks:
        _, ticket, seq, holder = entry
        key = (seq, id(holder))
        kept = latest.get(key)
        if kept is None or kept[1] < ticket:
            latest[key] = entry
    return compact(
        locks, lambda entry: latest[(entry[2], id(entry[3]))] is entry and _locked(entry)
    )


def _locked(entry: tuple[int, int, int, LockHolder]) -> bool:
    """Whether a lock's entry still names a delivery its holder holds under that lock."""
    deadline, _, seq, holder = entry
    message = holder.unacked.get(seq)
    return message is not None and message.lock_deadline == deadline
