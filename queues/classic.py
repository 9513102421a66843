"""The classic queue: messages shared round robin by credited consumers, each delivered once.

A message is AVAILABLE, ACQUIRED by one consumer (delivered, unsettled) or ARCHIVED (gone);
one given up on with a dead-letter exchange is DEAD_LETTERING at its place until its copies
are stored, and stays there as DEAD_LETTER_FAILED if that fails (:mod:`queues.message`). The
queue ties together the parts that each own one idea: its messages in publication order and
the pages of a durable backlog (:mod:`queues.backlog`), the order it serves them in
(:mod:`queues.ordering`: publication order with released messages back at their position, or
priority lanes), its consumers and their turns (:mod:`queues.consumers`), what handing a
message out and settling it do (:mod:`queues.handing_out`, :mod:`queues.settlement`), its timers
(:mod:`queues.deadlines`: TTL and delivery locks) and where the messages it gives up on go
(:mod:`queues.dead_lettering`). What stays here is the life of a message: enqueued (or
refused by overflow), given to a consumer, settled, released, expired, dropped.

Time comes from a shared :class:`~queues.queue_type.Clock`; a delivery also checks expiry, so
an expired message is never delivered even before the timer runs. Filtered consumers' walks
share a budget per call (:mod:`queues.filters.budget`): when it is spent, the queue goes on
serving them at the next tick (:meth:`ClassicQueue.expire`).
"""

from __future__ import annotations

import weakref
from typing import Final

from sluicegate.queues.arguments import DEFAULT_ARGUMENTS, QueueArguments
from sluicegate.queues.backlog import Backlog
from sluicegate.queues.consumers import Consumer, Consumers
from sluicegate.queues.dead_lettering import EXPIRED, DeadLetter, DeadLetterer
from sluicegate.queues.deadlines import Deadlines
from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.filters.budget import ReadBudget
from sluicegate.queues.handing_out import HandOut
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.message import ARCHIVED, AVAILABLE, Message
from sluicegate.queues.ordering import Cursor, Ordering, PriorityLanes, ReleasedLog
from sluicegate.queues.overflow import Limits
from sluicegate.queues.paging import Pager
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    Clock,
    ConsumerKey,
    ConsumerOptions,
    CreditReply,
    Dispatch,
    LockExpired,
    Outcome,
    QueueStatistics,
)
from sluicegate.queues.settlement import Outcomes, accept_all, settle_each
from sluicegate.queues.storage import QueueStore
from sluicegate.queues.timed_queues import TimedQueues
from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd

_NO_DISPATCH: Final[list[Dispatch]] = []
# Pages one expiry run may read in: a backlog that expired during a long pause is worked off
# over several timer runs instead of stalling the reactor thread for all of it at once.
_EXPIRY_PAGE_INS: Final = 8


class ClassicQueue:
    """An in-memory queue implementing :class:`queues.queue_type.QueueType`."""

    # Its messages stay counted in the held bytes while unacked (queues/settlement.py takes
    # them out): a session need not count them again (session/outgoing_link.py ``counted``).
    counts_unacked: Final = True

    def __init__(
        self,
        name: str,
        arguments: QueueArguments = DEFAULT_ARGUMENTS,
        *,
        clock: Clock | None = None,
        dead_letters: list[DeadLetter] | None = None,
        held: HeldBytes | None = None,
        timed: TimedQueues | None = None,
    ) -> None:
        self.name = name
        # The server-wide count of bytes held, for the memory budget.
        self.held = HeldBytes() if held is None else held
        self.arguments = arguments
        self.clock = clock if clock is not None else Clock()
        # Where dead letters go for routing to the dead-letter exchange (the registry's outbox).
        self.dead_letters: list[DeadLetter] = dead_letters if dead_letters is not None else []
        # The server's queues that have deadlines, so the timer visits only those.
        self.timed = timed if timed is not None else TimedQueues()
        self._deadlines = Deadlines(
            self, self.timed, arguments.message_ttl, arguments.consumer_timeout
        )
        self._backlog = Backlog(self.held, self._deadlines, weakref.WeakMethod(self._expire))
        self._order: Ordering = (
            Cursor(self._backlog, 0)
            if arguments.max_priority is None
            else PriorityLanes(self._backlog, arguments.max_priority)
        )
        self._consumers = Consumers(arguments.single_active_consumer)
        # Filters' work per call; when a call spent it, serving goes on at the next tick.
        self._budget = ReadBudget()
        # Messages released back, for the filtered consumers' walks to read.
        self._released = ReleasedLog()
        self._walks_paused = False
        self._dead_letterer = DeadLetterer(
            name,
            arguments.dead_letter_exchange,
            arguments.dead_letter_routing_key,
            self.dead_letters,
            self._backlog,
            self.held,
        )
        self._bounded = arguments.bounded
        self._limits = Limits(arguments)
        self._hand_out = HandOut(self._backlog, self._deadlines, self.clock, self.held)
        self._published = 0
        # Settled by consumers' ``accepted``: those archived as handed out are the hand-out's.
        self._acknowledged = 0
        self._rejected = 0
        self._expired = 0
        self._overflowed = 0
        self._lock_expired = 0

    # -- storage --------------------------------------------------------------------------

    @property
    def pager(self) -> Pager | None:
        """Set for a durable queue: ready messages beyond :attr:`resident_ready` go to pages."""
        return self._backlog.pager

    @pager.setter
    def pager(self, pager: Pager | None) -> None:
        self._backlog.pager = pager

    @property
    def resident_ready(self) -> int:
        """Ready messages kept as objects before new ones go to pages."""
        return self._backlog.resident_ready

    @resident_ready.setter
    def resident_ready(self, count: int) -> None:
        self._backlog.resident_ready = count

    def attach_store(self, store: QueueStore) -> None:
        """A durable queue pages its backlog beyond its resident messages to the log.

        A priority queue is not paged: pages keep one order.
        """
        if self.arguments.max_priority is None:
            self.pager = store.pager(self.name)

    def restore(self, store: QueueStore) -> None:
        """Append pages of messages a restart found in the log; they are paged in on demand."""
        backlog = self._backlog
        self._published += backlog.add_pages(store.take_recovered(self.name))
        if backlog.pager is None:
            while backlog.pages:
                for message in backlog.page_in():
                    self._order.add(message)
        if self.next_deadline() is not None:
            self._deadlines.join()

    def persists(self, message: Message) -> bool:
        """A durable classic queue logs persistent messages (header ``durable = true``)."""
        return message.read_header().durable

    def as_stored(self, message: Message) -> Message:
        """The message as it is: a classic queue logs the publisher's bytes."""
        return message

    # -- consumers ------------------------------------------------------------------------

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """Register a consumer with no credit; it starts at the queue's first message."""
        backlog = self._backlog
        cursor = Cursor(
            backlog,
            backlog.scavenge(),
            options.filter,
            options.browse,
            self._budget,
            options.views,
            self._released if options.filter is not None and not options.browse else None,
        )
        self._consumers.add(Consumer(consumer, ack_required, options, cursor))

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Remove a consumer; unsent messages return as they were, unsettled ones as failed."""
        consumers = self._consumers
        state = consumers.remove(consumer)
        if state is None:
            return _NO_DISPATCH
        unacked = state.unacked
        self._take_back_unsent(state, unsent)
        failed = list(unacked.values())
        unacked.clear()
        for message in failed:
            self._make_available(message)
        if state.active and consumers.single_active and not state.browse:
            consumers.promote()
        try:
            self._abandoned(failed)
        finally:
            dispatches = self._dispatch()
        return dispatches

    def give_back(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Take back what the consumer's session never sent; a browser walks them again."""
        state = self._consumers.by_key.get(consumer)
        if state is None or not unsent:
            return _NO_DISPATCH
        if state.browse:
            cursor = state.cursor
            cursor.position = min(cursor.position, min(message.seq for message in unsent))
            if state.waiting:
                self._consumers.behind[consumer] = state
                self._walks_paused = True
                self._deadlines.join()
            return _NO_DISPATCH
        self._take_back_unsent(state, unsent)
        return self._dispatch()

    def _take_back_unsent(self, state: Consumer, unsent: list[Message]) -> None:
        """The messages of ``unsent`` the consumer still holds return as they were."""
        if state.browse:
            return
        unacked = state.unacked
        for message in unsent:
            held = unacked.pop(message.seq, None)
            if held is not None:
                state.unacked_bytes -= held.held
            if held is message or (held is None and message.state == ARCHIVED):
                self._take_back(message)

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        """Set a consumer's credit, deliver what it can take, then reply once."""
        state = self._consumers.by_key[consumer]
        state.credit = link_credit_snd(delivery_count, credit, state.delivery_count)
        self._budget.refill()
        delivered = self._take(state, state.credit) if state.active else []
        self._pause_if_spent()
        if state.browse and self._walks_paused and state.credit > 0 and not drain:
            self._consumers.behind[consumer] = state
        if drain and state.credit > 0:
            # AMQP 1.0 §2.6.7: a drained sender advances delivery-count by its unused credit.
            state.delivery_count = (state.delivery_count + state.credit) & SERIAL_MASK
            state.credit = 0
        if state.credit > 0 and state.active:
            self._consumers.join(state)
        else:
            self._consumers.leave(state)
        reply = CreditReply(state.delivery_count, state.credit, self._backlog.ready, drain)
        return delivered, reply

    # -- messages -------------------------------------------------------------------------

    @property
    def available(self) -> int:
        """Messages ready to be delivered."""
        return self._backlog.ready

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Append a message; the next consumer with credit in rotation receives it.

        Raises :class:`~queues.errors.ResourceLimitExceeded` when the queue is full and its
        overflow is ``reject-publish``: nothing is then stored.
        """
        deadlines = self._deadlines
        if deadlines.ttl is not None:
            deadlines.apply_ttl(message, self.clock.now)
        if self._bounded and self._limits.refuses(self._backlog, message, self._dead_letterer):
            self._overflowed += 1
            raise ResourceLimitExceeded(f"queue '{self.name}' is full (x-overflow reject-publish)")
        backlog = self._backlog
        consumers = self._consumers
        waiting = consumers.waiting or consumers.browsing
        self._published += 1
        pager = backlog.pager
        if pager is not None and (
            backlog.pages
            or (backlog.ready - backlog.paged >= backlog.resident_ready and not waiting)
        ):
            # Nobody waits (a waiting consumer has paged everything in), so nothing is offered.
            backlog.page_out(pager, message)
            if self._bounded:
                self._drop_head()
            return _NO_DISPATCH
        backlog.append(message)
        expires = message.expires
        if expires is not None:
            deadlines.watch(message, expires)
        dispatches = consumers.offer(message, self._hand_out.give) if waiting else _NO_DISPATCH
        if consumers.deferred:
            consumers.deferred = False
            self._walks_paused = True
            self._deadlines.join()
        self._order.add(message)
        if message.state != AVAILABLE:
            return dispatches
        if expires is not None and expires <= self.clock.now:
            # A message that is already dead (ttl 0) lives only if a consumer takes it at once.
            self._expire(message)
        elif self._bounded:
            self._drop_head()
        return dispatches

    def settle(
        self,
        consumer: ConsumerKey,
        seqs: list[int],
        outcome: Outcome,
        delivery_failed: bool,
        *,
        undeliverable_here: bool = False,
        annotations: bytes | None = None,
    ) -> list[Dispatch]:
        """Apply an outcome (:mod:`queues.settlement`); what comes back is served again."""
        state = self._consumers.by_key.get(consumer)
        if state is None:
            return _NO_DISPATCH
        if outcome is Outcome.ACCEPTED and not state.lost:
            self._acknowledged += accept_all(state, seqs, self._backlog, self.held)
            return _NO_DISPATCH
        settled = settle_each(
            state,
            seqs,
            Outcomes(outcome, delivery_failed, undeliverable_here, annotations),
            self._backlog,
            self._dead_letterer,
            self.held,
        )
        self._acknowledged += settled.accepted
        self._rejected += settled.rejected
        returned = settled.returned
        for message in returned:
            self._make_available(message)
        late = settled.late
        dispatches = _NO_DISPATCH
        try:
            self._returned(returned, settled.failed, annotations)
        finally:
            if returned:
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
        count = self._backlog.purge()
        self._order.clear()
        self._released.clear()
        self._deadlines.expiries.clear()
        return count

    def expire(self) -> list[Dispatch]:
        """Expire messages and release deliveries whose deadline is the clock's time or past."""
        now = self.clock.now
        backlog = self._backlog
        if self._dead_letterer.exchange is None:
            # Nothing needs their bodies: whole pages past x-message-ttl go unread.
            self._expired += backlog.drop_expired_pages(now)
        for _ in range(_EXPIRY_PAGE_INS):
            # Paged messages expire from the head page, as RabbitMQ expires at a queue's head.
            deadline = backlog.head_deadline()
            if deadline is None or deadline > now:
                break
            backlog.page_in()
            self._expire_due(now)
        self._expire_due(now)
        released = self._deadlines.released(now)
        self._lock_expired += len(released)
        for message in released:
            self._make_available(message)
        self._deadlines.settle_timer(backlog.head_deadline())
        if not released and not self._walks_paused:
            return _NO_DISPATCH
        try:
            self._returned(released, released)
        finally:
            dispatches = self._dispatch()
        return dispatches

    def _expire_due(self, now: int) -> None:
        messages = self._backlog.messages
        for deadline, seq in self._deadlines.due(now):
            message = messages.get(seq)
            if message is not None and message.state == AVAILABLE and message.expires == deadline:
                self._expire(message)

    def next_deadline(self) -> int | None:
        """Now while filtered walks are paused; else the earliest expiry or lock deadline
        pending (perhaps of a message since gone)."""
        if self._walks_paused:
            return self.clock.now
        return self._deadlines.next_deadline(self._backlog.head_deadline())

    def statistics(self) -> QueueStatistics:
        """Counts for metrics and tests."""
        consumers = self._consumers.by_key.values()
        return QueueStatistics(
            name=self.name,
            ready=self._backlog.ready,
            unacked=sum(len(c.unacked) for c in consumers),
            consumers=len(consumers),
            ready_bytes=self._backlog.ready_bytes,
            published=self._published,
            delivered=self._hand_out.delivered,
            acknowledged=self._acknowledged + self._hand_out.archived,
            rejected=self._rejected,
            expired=self._expired,
            dead_lettered=self._dead_letterer.dead_lettered,
            dropped=self._dead_letterer.dropped,
            dead_letter_failed=self._backlog.stranded,
            dead_lettering_bytes=self._dead_letterer.waiting_bytes,
            overflowed=self._overflowed,
            lock_expired=self._lock_expired,
            unacked_bytes=sum(c.unacked_bytes for c in consumers),
        )

    def log_slots(self) -> int:
        """Slots the backlog keeps, holes included: what the scavenger bounds."""
        return len(self._backlog.messages)

    # -- state changes --------------------------------------------------------------------

    def _make_available(self, message: Message) -> None:
        """Put an acquired message back at its original position."""
        message.release()
        self._backlog.ready += 1
        self._backlog.ready_bytes += message.read_size()
        self._order.requeue(message)
        self._released.add(message.seq)
        if message.expires is not None:
            self._deadlines.watch(message, message.expires)

    def _take_back(self, message: Message) -> None:
        """Take back a message its consumer's session never sent, as if never delivered."""
        if message.state == ARCHIVED:
            # A settled-mode delivery: it was counted as consumed when handed out.
            self._hand_out.archived -= 1
            self._backlog.reinstate(message)
        self._hand_out.delivered -= 1
        self._make_available(message)

    def _returned(
        self, returned: list[Message], failed: list[Message], annotations: bytes | None = None
    ) -> None:
        """Deliveries back in the queue (released, modified, their lock expired), and those of
        them whose delivery failed: a classic queue counts failures against its delivery limit.
        ``annotations`` are a ``modified`` outcome's (a classic queue ignores a delivery time
        in them, as RabbitMQ's does)."""
        self._count_failures(failed)

    def _abandoned(self, messages: list[Message]) -> None:
        """Deliveries back in the queue because their consumer left them unsettled: failed."""
        self._count_failures(messages)

    def _count_failures(self, messages: list[Message]) -> None:
        limit = self.arguments.delivery_limit
        self._backlog.count_failures(messages, limit, self._dead_letterer.send)

    def _drop_head(self) -> None:
        dead_letterer = self._dead_letterer
        now = self.clock.now
        self._overflowed += self._limits.drop_head(self._backlog, self._order, now, dead_letterer)

    def _expire(self, message: Message) -> None:
        self._expired += 1
        self._dead_letterer.send(message, EXPIRED)

    # -- handing out ----------------------------------------------------------------------

    def _dispatch(self) -> list[Dispatch]:
        """Serve waiting consumers within a fresh budget: the browsers behind first."""
        self._budget.refill()
        consumers = self._consumers
        if consumers.behind:
            dispatches = self._walk_behind()
            dispatches += consumers.dispatch(self._fetch, self._backlog)
        else:
            dispatches = consumers.dispatch(self._fetch, self._backlog)
        self._pause_if_spent()
        return dispatches

    def _walk_behind(self) -> list[Dispatch]:
        """Walk on the browsers behind, in turn, until each caught up or the budget is spent."""
        consumers = self._consumers
        behind = consumers.behind
        budget = self._budget
        dispatches: list[Dispatch] = []
        for key in list(behind):
            state = behind.pop(key)
            dispatches.extend((key, message) for message in self._take(state, state.credit))
            if state.credit == 0:
                consumers.leave(state)
            elif budget.spent:
                behind[key] = state
                break
        return dispatches

    def _pause_if_spent(self) -> None:
        """A spent budget leaves walks unfinished: the timer comes back at once to go on."""
        self._walks_paused = self._budget.spent
        if self._walks_paused:
            self._deadlines.join()

    def _fetch(self, state: Consumer) -> Message | None:
        """The next message for ``state`` in its order, given to it."""
        walk: Ordering = state.cursor if state.scans else self._order
        message = walk.next(self.clock.now)
        return None if message is None else self._hand_out.give(state, message)

    def _take(self, state: Consumer, limit: int) -> list[Message]:
        """Up to ``limit`` messages for a consumer's credit request."""
        taken: list[Message] = []
        if state.scans or self._deadlines.timeout is not None:
            while len(taken) < limit and (message := self._fetch(state)) is not None:
                taken.append(message)
            return taken
        # The hot path of consuming: one call hands out the batch.
        self._order.take(limit, self.clock.now, taken)
        self._hand_out.give_all(state, taken)
        return taken
