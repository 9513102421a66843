"""The classic queue: a FIFO of messages shared round robin by credited consumers.

A message is AVAILABLE, ACQUIRED by one consumer (delivered, unsettled) or ARCHIVED (gone).
Messages live in ``_log``, a dict by sequence number, so any message is found in O(1) and an
archived one leaves at once, whatever order consumers settle in: the log holds only live
messages, even behind one that a consumer holds for hours. Archiving leaves a gap in the
sequence; the scavenger moves ``_low`` (a lower bound of live sequence numbers) over the gaps
lazily, each gap once, so every message costs amortised O(1) however long the queue.

AVAILABLE messages are served in publication order. ``_cursor`` marks how far the queue has
handed out messages in order; a message released behind it waits in ``_returned``, a heap by
sequence number, and is served before the cursor moves on: back at its original position.
Filtered and browsing consumers keep their own cursor and heap, since they skip what they do
not match. Heaps are lazy: an entry whose message changed state meanwhile is dropped when met.

A durable queue's ready backlog beyond ``resident_ready`` waits in pages at the tail
(:mod:`queues.paging`), outside the sequence: a cursor that reaches the end of ``_log`` pages
the head page in, its messages taking the next sequence numbers. A priority queue
(``x-max-priority``) serves from one lane of sequence numbers per priority instead of the
cursor, highest priority first; it is not paged.

Time comes from a shared :class:`~queues.queue_type.Clock`. Expiry deadlines (``ttl``,
``absolute-expiry-time``, ``x-message-ttl``) and delivery locks (``x-consumer-timeout``) sit in
heaps that :meth:`ClassicQueue.expire` pops; a delivery also checks expiry, so an expired message
is never delivered even before the timer runs.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Final

from sluicegate.queues.arguments import DEFAULT_ARGUMENTS, Overflow, QueueArguments
from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import ACQUIRED, ARCHIVED, AVAILABLE, Message
from sluicegate.queues.paging import RESIDENT_READY, Page, Pager
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    Clock,
    ConsumerKey,
    ConsumerOptions,
    CreditReply,
    DeadLetter,
    Dispatch,
    LockExpired,
    MessageFilter,
    Outcome,
    QueueStatistics,
    QueueType,
)
from sluicegate.wire.sections import read_header
from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd

_NO_DISPATCH: Final[list[Dispatch]] = []
# Deliveries whose lock expired that a consumer may still settle late and get a clear error;
# older ones are forgotten (their late settlement is then ignored like any unknown one).
_MAX_LOST_LOCKS: Final = 65536
# Pages one expiry run may read in: a backlog that expired during a long pause is worked off
# over several timer runs instead of stalling the reactor thread for all of it at once.
_EXPIRY_PAGE_INS: Final = 8

# Dead-letter reasons, as RabbitMQ names them in x-death / x-opt-deaths.
REJECTED: Final = "rejected"
EXPIRED: Final = "expired"
DELIVERY_LIMIT: Final = "delivery_limit"
MAXLEN: Final = "maxlen"


class Consumer:
    """One consumer's side of the queue link: its credit and what it holds unsettled."""

    __slots__ = (
        "ack_required",
        "active",
        "browse",
        "credit",
        "cursor",
        "delivery_count",
        "filter",
        "key",
        "lost",
        "priority",
        "returned",
        "unacked",
        "waiting",
    )

    def __init__(self, key: ConsumerKey, ack_required: bool, options: ConsumerOptions) -> None:
        self.key = key
        self.ack_required = ack_required and not options.browse
        self.filter: MessageFilter | None = options.filter
        self.browse = options.browse
        self.priority = options.priority
        self.delivery_count = 0
        self.credit = 0
        self.unacked: dict[int, Message] = {}
        # True while the consumer sits in the queue's rotation of consumers with credit.
        self.waiting = False
        # False for a single-active-consumer queue's consumers that wait their turn.
        self.active = True
        # For filtered and browsing consumers: the next sequence number to look at, and the
        # messages released behind it that it has not seen since.
        self.cursor = 0
        self.returned: list[int] = []
        # Deliveries released by lock expiry, so that their late settlement gets an error.
        self.lost: dict[int, None] = {}

    @property
    def scans(self) -> bool:
        """True when the consumer does not take the queue's messages simply in order."""
        return self.filter is not None or self.browse


class ClassicQueue:
    """An in-memory queue implementing :class:`queues.queue_type.QueueType`."""

    def __init__(
        self,
        name: str,
        arguments: QueueArguments = DEFAULT_ARGUMENTS,
        *,
        clock: Clock | None = None,
        dead_letters: list[DeadLetter] | None = None,
        held: HeldBytes | None = None,
        timed: set[QueueType] | None = None,
    ) -> None:
        self.name = name
        # The server-wide count of bytes held, for the memory budget.
        self.held = HeldBytes() if held is None else held
        self.arguments = arguments
        self.clock = clock if clock is not None else Clock()
        # Where dead letters go for routing to the dead-letter exchange (the registry's outbox).
        self.dead_letters: list[DeadLetter] = dead_letters if dead_letters is not None else []
        # The server's queues that have deadlines: joined here, left when expire() runs dry,
        # so the timer visits only queues with something to time.
        self.timed: set[QueueType] = timed if timed is not None else set()
        self._log: dict[int, Message] = {}
        # Set for a durable queue: ready messages beyond RESIDENT_READY go to pages at the tail
        # (queues.paging), messages not yet in the sequence.
        self.pager: Pager | None = None
        # A priority queue (x-max-priority): per priority, its available messages' sequence
        # numbers in order, and a heap of those released back, served first in their lane.
        # Such a queue is not paged: pages keep one order.
        lanes = None if arguments.max_priority is None else arguments.max_priority + 1
        self._lanes: list[deque[int]] | None = None
        self._lane_returned: list[list[int]] = []
        if lanes is not None:
            self._lanes = [deque() for _ in range(lanes)]
            self._lane_returned = [[] for _ in range(lanes)]
        self.resident_ready = RESIDENT_READY
        self._pages: deque[Page] = deque()
        self._paged = 0
        self._low = 0
        self._cursor = 0
        self._returned: list[int] = []
        self._available = 0
        self._ready_bytes = 0
        self._next_seq = 0
        self._expiries: list[tuple[int, int]] = []
        # (deadline, ticket, message, holder): the ticket keeps entries comparable.
        self._locks: list[tuple[int, int, Message, Consumer]] = []
        self._tickets = 0
        self._consumers: dict[ConsumerKey, Consumer] = {}
        # Consumers with credit by priority, highest first; round robin within a priority.
        self._rotation: list[tuple[int, deque[Consumer]]] = []
        self._waiting = 0
        # Browsing consumers with credit.
        self._browsing = 0
        self._ttl = arguments.message_ttl
        self._bounded = arguments.bounded
        self._browsers: list[Consumer] = []
        # Filtered consumers that acquire: each sees messages released behind its cursor.
        self._filtered: list[Consumer] = []
        self._published = 0
        self._delivered = 0
        self._acknowledged = 0
        self._rejected = 0
        self._expired = 0
        self._dead_lettered = 0
        self._dropped = 0
        self._overflowed = 0
        self._lock_expired = 0

    # -- consumers ------------------------------------------------------------------------

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """Register a consumer with no credit; it starts at the queue's first message."""
        state = Consumer(consumer, ack_required, options)
        self._scavenge()
        state.cursor = self._low
        if self.arguments.single_active_consumer and not state.browse:
            state.active = not any(c.active and not c.browse for c in self._consumers.values())
        self._consumers[consumer] = state
        if state.browse:
            self._browsers.append(state)
        elif state.filter is not None:
            self._filtered.append(state)

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Remove a consumer; unsent messages return as they were, unsettled ones as failed."""
        state = self._consumers.pop(consumer, None)
        if state is None:
            return _NO_DISPATCH
        state.credit = 0
        self._leave_rotation(state)
        if state.browse:
            self._browsers.remove(state)
        elif state.filter is not None:
            self._filtered.remove(state)
        unacked = state.unacked
        for message in unsent:
            if state.browse:
                continue
            held = unacked.pop(message.seq, None)
            if held is message or (held is None and message.state == ARCHIVED):
                self._restore(message)
        failed = list(unacked.values())
        unacked.clear()
        for message in failed:
            self._make_available(message)
        if state.active and self.arguments.single_active_consumer and not state.browse:
            self._promote()
        try:
            self._count_failures(failed)
        finally:
            dispatches = self._dispatch()
        return dispatches

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        """Set a consumer's credit, deliver what it can take, then reply once."""
        state = self._consumers[consumer]
        state.credit = link_credit_snd(delivery_count, credit, state.delivery_count)
        delivered = self._take(state, state.credit) if state.active else []
        if drain and state.credit > 0:
            # AMQP 1.0 §2.6.7: a drained sender advances delivery-count by its unused credit.
            state.delivery_count = (state.delivery_count + state.credit) & SERIAL_MASK
            state.credit = 0
        if state.credit > 0 and state.active:
            self._join_rotation(state)
        else:
            self._leave_rotation(state)
        reply = CreditReply(state.delivery_count, state.credit, self._available, drain)
        return delivered, reply

    # -- messages -------------------------------------------------------------------------

    @property
    def available(self) -> int:
        """Messages ready to be delivered."""
        return self._available

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Append a message; the next consumer with credit in rotation receives it.

        Raises :class:`~queues.errors.ResourceLimitExceeded` when the queue is full and its
        overflow is ``reject-publish``: nothing is then stored.
        """
        ttl = self._ttl
        if ttl is not None:
            deadline = self.clock.now + ttl
            if message.expires is None or deadline < message.expires:
                message.expires = deadline
        if self._bounded and self._refuse(message):
            self._overflowed += 1
            if self.arguments.overflow is Overflow.REJECT_PUBLISH_DLX:
                self._dead_letter(message, MAXLEN)
            raise ResourceLimitExceeded(f"queue '{self.name}' is full (x-overflow reject-publish)")
        pager = self.pager
        lanes = self._lanes
        if lanes is not None:
            self._set_priority(message, lanes)
        elif pager is not None and (
            self._pages
            or (
                self._available - self._paged >= self.resident_ready
                and not self._waiting
                and not self._browsing
            )
        ):
            # Nobody waits (a waiting consumer has paged everything in), so nothing is offered.
            self._page_out(pager, message)
            if self._bounded:
                self._drop_head()
            return _NO_DISPATCH
        message.seq = seq = self._next_seq
        self._next_seq = seq + 1
        self._published += 1
        self._log[seq] = message
        self._available += 1
        self._ready_bytes += message.size
        self.held.total += message.held + MESSAGE_OVERHEAD
        expires = message.expires
        if expires is not None:
            heapq.heappush(self._expiries, (expires, seq))
            self.timed.add(self)
        if self._waiting or self._browsing:
            dispatches = self._offer(message)
            if message.state != AVAILABLE:
                return dispatches
        else:
            dispatches = _NO_DISPATCH
        if lanes is not None:
            lanes[message.priority].append(seq)
        if expires is not None and expires <= self.clock.now:
            # A message that is already dead (ttl 0) lives only if a consumer takes it at once.
            self._expire(message)
        elif self._bounded:
            self._drop_head()
        return dispatches

    def restore(self, pages: Sequence[Page]) -> None:
        """Append pages of messages a restart found in the log; they are paged in on demand."""
        for page in pages:
            self._pages.append(page)
            count = page.count
            self._paged += count
            self._available += count
            self._published += count
            self._ready_bytes += page.ready_bytes
            self.held.total += page.held
        if self._lanes is not None:
            while self._pages:
                self._page_in()
        if self.next_deadline() is not None:
            self.timed.add(self)

    def settle(
        self, consumer: ConsumerKey, seqs: list[int], outcome: Outcome, delivery_failed: bool
    ) -> list[Dispatch]:
        """Apply an outcome: accepted archives, rejected dead-letters, the others requeue."""
        state = self._consumers.get(consumer)
        if state is None:
            return _NO_DISPATCH
        unacked = state.unacked
        if outcome is Outcome.ACCEPTED and not state.lost:
            # The common case, kept tight: archive each delivery in place.
            log = self._log
            settled = 0
            freed = 0
            for seq in seqs:
                message = unacked.pop(seq, None)
                if message is not None:
                    message.state = ARCHIVED
                    del log[seq]
                    settled += 1
                    freed += message.held
            self._acknowledged += settled
            self.held.total -= freed + settled * MESSAGE_OVERHEAD
            return _NO_DISPATCH
        late: list[int] = []
        failed: list[Message] = []
        requeued = False
        lost = state.lost
        for seq in seqs:
            if seq in lost:
                # The first settlement after a lock expired is the late one, even if the message
                # was redelivered to this consumer since (same sequence number): ambiguous
                # settlements never archive, the consumer's link is told instead.
                del lost[seq]
                late.append(seq)
                continue
            message = unacked.pop(seq, None)
            if message is None:
                continue
            if outcome is Outcome.ACCEPTED:
                self._acknowledged += 1
                self._archive(message)
            elif outcome is Outcome.REJECTED:
                self._rejected += 1
                self._archive(message)
                self._dead_letter(message, REJECTED)
            else:
                requeued = True
                self._make_available(message)
                if delivery_failed and outcome is Outcome.MODIFIED:
                    failed.append(message)
        dispatches = _NO_DISPATCH
        try:
            self._count_failures(failed)
        finally:
            if requeued:
                dispatches = self._dispatch()
        if late:
            raise LockExpired(
                f"deliveries {late} of queue '{self.name}' were released when their lock "
                f"expired after {self.arguments.consumer_timeout} ms; this settlement "
                "changed nothing",
                dispatches,
            )
        return dispatches

    def purge(self) -> int:
        """Drop every available message; return how many were dropped."""
        count = self._available
        log = self._log
        freed = 0
        for seq, message in list(log.items()):
            if message.state == AVAILABLE:
                message.discard()
                freed += message.held
                del log[seq]
        resident = count - self._paged
        for page in self._pages:
            page.drop()
            freed += page.held
        self._pages.clear()
        self._paged = 0
        self._returned.clear()
        if self._lanes is not None:
            for lane in self._lanes:
                lane.clear()
            for returned in self._lane_returned:
                returned.clear()
        for state in self._filtered:
            state.returned.clear()
        self._expiries.clear()
        self.held.total -= freed + resident * MESSAGE_OVERHEAD
        self._available = 0
        self._ready_bytes = 0
        return count

    def expire(self) -> list[Dispatch]:
        """Expire messages and release deliveries whose deadline is the clock's time or past."""
        now = self.clock.now
        for _ in range(_EXPIRY_PAGE_INS):
            # Paged messages expire from the head page, as RabbitMQ expires at a queue's head.
            deadline = self._pages[0].head_deadline(self._ttl) if self._pages else None
            if deadline is None or deadline > now:
                break
            self._page_in()
            self._expire_due(now)
        self._expire_due(now)
        locks = self._locks
        released: list[Message] = []
        while locks and locks[0][0] <= now:
            deadline, _, message, state = heapq.heappop(locks)
            seq = message.seq
            if state.unacked.get(seq) is message and message.lock_deadline == deadline:
                del state.unacked[seq]
                self._lock_expired += 1
                if len(state.lost) >= _MAX_LOST_LOCKS:
                    del state.lost[next(iter(state.lost))]
                state.lost[seq] = None
                self._make_available(message)
                released.append(message)
        if self.next_deadline() is None:
            self.timed.discard(self)
        if not released:
            return _NO_DISPATCH
        try:
            self._count_failures(released)
        finally:
            dispatches = self._dispatch()
        return dispatches

    def _expire_due(self, now: int) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            deadline, seq = heapq.heappop(expiries)
            message = self._find(seq)
            if message is not None and message.state == AVAILABLE and message.expires == deadline:
                self._expire(message)

    def next_deadline(self) -> int | None:
        """The earliest expiry or lock deadline pending (perhaps of a message since gone)."""
        deadlines = []
        if self._expiries:
            deadlines.append(self._expiries[0][0])
        if self._locks:
            deadlines.append(self._locks[0][0])
        if self._pages:
            head = self._pages[0].head_deadline(self._ttl)
            if head is not None:
                deadlines.append(head)
        return min(deadlines) if deadlines else None

    def statistics(self) -> QueueStatistics:
        """Counts for metrics and tests."""
        return QueueStatistics(
            name=self.name,
            ready=self._available,
            unacked=sum(len(c.unacked) for c in self._consumers.values()),
            consumers=len(self._consumers),
            ready_bytes=self._ready_bytes,
            published=self._published,
            delivered=self._delivered,
            acknowledged=self._acknowledged,
            rejected=self._rejected,
            expired=self._expired,
            dead_lettered=self._dead_lettered,
            dropped=self._dropped,
            overflowed=self._overflowed,
            lock_expired=self._lock_expired,
            unacked_bytes=sum(m.held for c in self._consumers.values() for m in c.unacked.values()),
        )

    def holds(self, consumer: ConsumerKey) -> set[int]:
        """The sequence numbers a consumer holds unsettled."""
        state = self._consumers.get(consumer)
        return set(state.unacked) if state is not None else set()

    def log_slots(self) -> int:
        """Slots the log keeps, holes included: what the scavenger bounds."""
        return len(self._log)

    # -- state changes --------------------------------------------------------------------

    def _archive(self, message: Message) -> None:
        message.state = ARCHIVED
        del self._log[message.seq]
        self.held.total -= message.held + MESSAGE_OVERHEAD

    def _make_available(self, message: Message) -> None:
        """Put an acquired message back at its original position."""
        message.state = AVAILABLE
        self._available += 1
        self._ready_bytes += message.size
        seq = message.seq
        if self._lanes is not None:
            heapq.heappush(self._lane_returned[message.priority], seq)
        elif seq < self._cursor:
            heapq.heappush(self._returned, seq)
        for state in self._filtered:
            if seq < state.cursor:
                heapq.heappush(state.returned, seq)
        if message.expires is not None:
            heapq.heappush(self._expiries, (message.expires, seq))
            self.timed.add(self)

    def _restore(self, message: Message) -> None:
        """Take back a message its consumer's session never sent, as if never delivered."""
        if message.state == ARCHIVED:
            # A settled-mode delivery: it was counted as consumed when handed out.
            self._acknowledged -= 1
            self._log[message.seq] = message
            self._low = min(self._low, message.seq)
            self.held.total += message.held + MESSAGE_OVERHEAD
        self._delivered -= 1
        self._make_available(message)

    def _count_failures(self, messages: list[Message]) -> None:
        """Count a failed delivery on each message, dead-lettering those past the limit.

        Runs after the messages are back in the queue, so that a header that cannot be
        re-encoded loses nothing: that message keeps its old count, the others get theirs.
        """
        limit = self.arguments.delivery_limit
        error: Exception | None = None
        for message in messages:
            size, held = message.size, message.held
            try:
                message.count_failed_delivery()
            except Exception as exc:
                error = error or exc
                continue
            self._ready_bytes += message.size - size
            self.held.total += message.held - held
            if limit is not None and message.delivery_count > limit:
                self._remove_available(message)
                self._dead_letter(message, DELIVERY_LIMIT)
        if error is not None:
            raise error

    def _remove_available(self, message: Message) -> None:
        """Take a message nobody received out of the queue (expired, dropped, dead-lettered)."""
        self._available -= 1
        self._ready_bytes -= message.size
        message.discard()
        del self._log[message.seq]
        self.held.total -= message.held + MESSAGE_OVERHEAD

    def _page_out(self, pager: Pager, message: Message) -> None:
        """Append a ready message to the tail pages instead of the resident messages."""
        pages = self._pages
        tail = pages[-1] if pages else None
        before = tail.held if tail is not None else 0
        page = pager.append(tail, message)
        if page is None:
            assert tail is not None
            self.held.total += tail.held - before
        else:
            pages.append(page)
            self.held.total += page.held
            if len(pages) == 1 and page.head_deadline(self._ttl) is not None:
                self.timed.add(self)
        self._published += 1
        self._paged += 1
        self._available += 1
        self._ready_bytes += message.size

    def _paged_in(self) -> int:
        """Page in the head page for a cursor at the end of the resident messages: the new end."""
        self._page_in()
        return self._next_seq

    def _page_in(self) -> None:
        """Give the head page's messages the next sequence numbers: they become resident."""
        page = self._pages.popleft()
        messages = page.take(self._ttl)
        self._paged -= len(messages)
        seq = self._next_seq
        log = self._log
        held = 0
        expiries = self._expiries
        lanes = self._lanes
        for message in messages:
            message.seq = seq
            log[seq] = message
            if lanes is not None:
                self._set_priority(message, lanes)
                lanes[message.priority].append(seq)
            held += message.held
            expires = message.expires
            if expires is not None:
                heapq.heappush(expiries, (expires, seq))
            seq += 1
        self._next_seq = seq
        self.held.total += held + len(messages) * MESSAGE_OVERHEAD - page.held
        if expiries:
            self.timed.add(self)

    def _expire(self, message: Message) -> None:
        self._expired += 1
        self._remove_available(message)
        self._dead_letter(message, EXPIRED)

    def _dead_letter(self, message: Message, reason: str) -> None:
        exchange = self.arguments.dead_letter_exchange
        if exchange is None:
            self._dropped += 1
            return
        self._dead_lettered += 1
        self.dead_letters.append(
            DeadLetter(self.name, message, reason, exchange, self.arguments.dead_letter_routing_key)
        )

    def _refuse(self, message: Message) -> bool:
        """True when a reject-publish queue has no room for ``message``."""
        if self.arguments.overflow is Overflow.DROP_HEAD:
            return False
        max_length = self.arguments.max_length
        max_bytes = self.arguments.max_length_bytes
        return (max_length is not None and self._available >= max_length) or (
            max_bytes is not None and self._ready_bytes + message.size > max_bytes
        )

    def _drop_head(self) -> None:
        """Drop the oldest available messages until the queue is within its limits."""
        max_length = self.arguments.max_length
        max_bytes = self.arguments.max_length_bytes
        while (max_length is not None and self._available > max_length) or (
            max_bytes is not None and self._ready_bytes > max_bytes
        ):
            message = self._next_available()
            if message is None:
                break
            self._overflowed += 1
            self._remove_available(message)
            self._dead_letter(message, MAXLEN)

    def _scavenge(self) -> None:
        """Move ``_low`` over the gaps archived messages left at the front of the sequence."""
        log = self._log
        low = self._low
        end = self._next_seq
        while low < end and low not in log:
            low += 1
        self._low = low

    # -- finding messages -----------------------------------------------------------------

    def _find(self, seq: int) -> Message | None:
        """The message with sequence number ``seq`` if the queue still holds it."""
        return self._log.get(seq)

    def _next_available(self) -> Message | None:
        """The oldest available message (not yet acquired), expiring dead ones on the way."""
        if self._lanes is not None:
            return self._next_by_priority(self._lanes)
        now = self.clock.now
        returned = self._returned
        while returned:
            message = self._find(heapq.heappop(returned))
            if message is None or message.state != AVAILABLE:
                continue
            if message.expires is not None and message.expires <= now:
                self._expire(message)
                continue
            return message
        log = self._log
        seq = max(self._cursor, self._low)
        end = self._next_seq
        while seq < end or (self._pages and (end := self._paged_in()) > seq):
            message = log.get(seq)
            seq += 1
            if message is None or message.state != AVAILABLE:
                continue
            if message.expires is not None and message.expires <= now:
                self._expire(message)
                continue
            self._cursor = seq
            return message
        self._cursor = end
        return None

    @staticmethod
    def _set_priority(message: Message, lanes: list[deque[int]]) -> None:
        """The header's priority (AMQP default 4); above x-max-priority counts as it."""
        message.priority = min(read_header(message.payload).priority, len(lanes) - 1)

    def _next_by_priority(self, lanes: list[deque[int]]) -> Message | None:
        """The oldest available message of the highest priority that has one.

        Entries are dropped lazily: a lane may still name a message taken by a filtered
        consumer or a browser (they scan in arrival order), expired or archived since.
        """
        now = self.clock.now
        log = self._log
        for priority in range(len(lanes) - 1, -1, -1):
            lane = lanes[priority]
            returned = self._lane_returned[priority]
            while returned or lane:
                if returned and (not lane or returned[0] < lane[0]):
                    seq = heapq.heappop(returned)
                else:
                    seq = lane.popleft()
                message = log.get(seq)
                if message is None or message.state != AVAILABLE:
                    continue
                if message.expires is not None and message.expires <= now:
                    self._expire(message)
                    continue
                return message
        return None

    def _next_scanned(self, state: Consumer) -> Message | None:
        """The next message a filtered or browsing consumer takes, moving its cursor."""
        now = self.clock.now
        accept = state.filter
        wanted = (AVAILABLE, ACQUIRED) if state.browse else (AVAILABLE,)
        returned = state.returned
        while returned:
            message = self._find(heapq.heappop(returned))
            if message is None or message.state != AVAILABLE:
                continue
            if message.expires is not None and message.expires <= now:
                self._expire(message)
                continue
            if accept is None or accept(message):
                return message
        log = self._log
        seq = max(state.cursor, self._low)
        end = self._next_seq
        while seq < end or (self._pages and (end := self._paged_in()) > seq):
            message = log.get(seq)
            seq += 1
            if message is None or message.state not in wanted:
                continue
            if message.expires is not None and message.expires <= now:
                if message.state == AVAILABLE:
                    self._expire(message)
                continue
            if accept is None or accept(message):
                state.cursor = seq
                return message
        state.cursor = end
        return None

    def _give(self, state: Consumer, message: Message) -> Message:
        """Hand a message to a consumer: acquired, or archived at once when settled mode."""
        state.credit -= 1
        state.delivery_count = (state.delivery_count + 1) & SERIAL_MASK
        self._delivered += 1
        if state.browse:
            return message
        message.state = ACQUIRED
        self._available -= 1
        self._ready_bytes -= message.size
        if state.ack_required:
            state.unacked[message.seq] = message
            timeout = self.arguments.consumer_timeout
            if timeout is not None:
                deadline = message.lock_deadline = self.clock.now + timeout
                self._tickets += 1
                heapq.heappush(self._locks, (deadline, self._tickets, message, state))
                self.timed.add(self)
        else:
            self._acknowledged += 1
            self._archive(message)
        return message

    def _take(self, state: Consumer, limit: int) -> list[Message]:
        taken: list[Message] = []
        give = self._give
        if state.scans or self.arguments.consumer_timeout is not None or self._lanes is not None:
            while len(taken) < limit:
                message = self._next_scanned(state) if state.scans else self._next_available()
                if message is None:
                    break
                taken.append(give(state, message))
        else:
            while self._returned and len(taken) < limit:
                message = self._next_available()
                if message is None:
                    break
                taken.append(give(state, message))
            if len(taken) < limit:
                self._take_in_order(state, limit - len(taken), taken)
        return taken

    def _take_in_order(self, state: Consumer, limit: int, taken: list[Message]) -> None:
        """:meth:`_give` over the log from the cursor, inlined: the hot path of consuming."""
        log = self._log
        seq = max(self._cursor, self._low)
        end = self._next_seq
        now = self.clock.now
        ack_required = state.ack_required
        unacked = state.unacked
        count = 0
        size_taken = 0
        held_taken = 0
        while count < limit and (seq < end or (self._pages and (end := self._paged_in()) > seq)):
            message = log.get(seq)
            seq += 1
            if message is None or message.state != AVAILABLE:
                continue
            expires = message.expires
            if expires is not None and expires <= now:
                self._expire(message)
                continue
            count += 1
            size_taken += message.size
            held_taken += message.held
            taken.append(message)
            if ack_required:
                message.state = ACQUIRED
                unacked[message.seq] = message
            else:
                message.state = ARCHIVED
                del log[seq - 1]
        self._cursor = seq
        if not ack_required:
            self.held.total -= held_taken + count * MESSAGE_OVERHEAD
        if count:
            state.credit -= count
            state.delivery_count = (state.delivery_count + count) & SERIAL_MASK
            self._delivered += count
            self._available -= count
            self._ready_bytes -= size_taken
            if not ack_required:
                self._acknowledged += count

    # -- dispatch -------------------------------------------------------------------------

    def _join_rotation(self, state: Consumer) -> None:
        if state.waiting:
            return
        state.waiting = True
        if state.browse:
            self._browsing += 1
            return
        self._waiting += 1
        rotation = self._rotation
        for priority, group in rotation:
            if priority == state.priority:
                group.append(state)
                return
        rotation.append((state.priority, deque([state])))
        rotation.sort(key=lambda entry: -entry[0])

    def _leave_rotation(self, state: Consumer) -> None:
        if not state.waiting:
            return
        state.waiting = False
        if state.browse:
            self._browsing -= 1
            return
        self._waiting -= 1
        for priority, group in self._rotation:
            if priority == state.priority:
                group.remove(state)
                return

    def _served(self, state: Consumer, group: deque[Consumer]) -> None:
        """A waiting consumer got a message: to the back of its group, or out if spent."""
        if state.credit > 0:
            group.append(state)
        else:
            state.waiting = False
            self._waiting -= 1

    def _offer(self, message: Message) -> list[Dispatch]:
        """A new message: copies to waiting browsers, then the first waiting taker that wants it."""
        dispatches: list[Dispatch] = []
        if self._browsing:
            for state in self._browsers:
                if not state.waiting:
                    continue
                state.cursor = message.seq + 1
                if state.filter is None or state.filter(message):
                    dispatches.append((state.key, self._give(state, message)))
                    if state.credit == 0:
                        self._leave_rotation(state)
        if not self._waiting:
            return dispatches
        for _, group in self._rotation:
            for index, state in enumerate(group):
                accept = state.filter
                if accept is not None:
                    state.cursor = message.seq + 1
                    if not accept(message):
                        continue
                del group[index]
                self._give(state, message)
                self._served(state, group)
                dispatches.append((state.key, message))
                return dispatches
        return dispatches

    def _dispatch(self) -> list[Dispatch]:
        """Hand available messages to waiting consumers, one each in turn, by priority."""
        dispatches: list[Dispatch] = []
        for _, group in self._rotation:
            while group and self._available:
                # One pass over the group: each consumer takes one message or leaves the turn.
                progressed = False
                for _ in range(len(group)):
                    state = group.popleft()
                    message = self._next_scanned(state) if state.scans else self._next_available()
                    if message is None:
                        group.append(state)
                        continue
                    self._give(state, message)
                    dispatches.append((state.key, message))
                    progressed = True
                    self._served(state, group)
                if not progressed:
                    break
        return dispatches

    def _promote(self) -> None:
        """A single active consumer left: the longest-waiting other consumer takes over."""
        for state in self._consumers.values():
            if not state.browse:
                state.active = True
                if state.credit > 0:
                    self._join_rotation(state)
                return
