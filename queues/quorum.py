"""The quorum queue type (``x-queue-type: quorum``) on one node: RabbitMQ 4's quorum semantics.

What makes a quorum queue differ from a classic one, as RabbitMQ 4.2's ``rabbit_fifo`` does:

- **Durable, persistent by default.** It is durable and neither exclusive nor auto-delete
  (refused otherwise); every message it takes goes through the durable log before its
  publisher hears ``accepted``, whatever the header's ``durable`` says.
- **Returns first.** A message that comes back unsettled (released, modified, its consumer
  gone) waits at the back of the returns, which are served before any other message.
- **Two priority levels.** A message of priority above 4 is high, the rest (AMQP's default is
  4) normal; while both wait, two high ones are served for each normal one, an older normal
  one going first on the third turn (RabbitMQ's ``rabbit_fifo_q``).
- **Delivery limit, 20 by default.** Every return counts (RabbitMQ 4's acquired count, kept in
  :attr:`Message.returned`); a message back more times than the limit is dead-lettered with
  reason ``delivery_limit``, or dropped. ``x-delivery-limit`` below 0 means no limit. The
  header's delivery-count goes up only for a failed delivery (``modified`` with
  delivery-failed, a lock that expired), not for a release or a consumer that left.
- **At-least-once dead-lettering** (``x-dead-letter-strategy``, with ``reject-publish``
  overflow): a dead letter that no queue takes (the exchange is missing, routes nowhere, or a
  queue refuses it) is kept and sent again every :data:`DEAD_LETTER_RETRY_MS`, skipping the
  queues that took it; kept letters count against the queue's length limits, so its
  publishers are refused meanwhile. A kept letter is held at its place in the queue, its log
  record unsettled, until its copies are stored (docs/queues.md).
- **Delayed retry, per message** (RabbitMQ 4.3): a ``modified`` outcome whose annotations
  carry ``x-opt-delivery-time`` puts the message back, not delivered before that time
  (queues/delayed_returns.py), whatever the queue's own delayed-retry settings.
- **Single active consumer with priorities.** The consumer of the highest priority
  (``rabbitmq:priority``) is the active one; among equals, the first attached. A consumer of
  higher priority that attaches takes over once the active one holds nothing unsettled.

Replication is not here: one node, one copy, in the durable log (docs/queues.md says what a
cluster would add).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Final

from sluicegate.queues.arguments import DeadLetterStrategy, QueueArguments
from sluicegate.queues.backlog import Backlog
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.consumers import Consumer, Consumers
from sluicegate.queues.dead_lettering import DELIVERY_LIMIT, DeadLetter, DeadLetterer
from sluicegate.queues.delayed_returns import DelayedReturns
from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.message import AVAILABLE, Message
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    Clock,
    ConsumerKey,
    ConsumerOptions,
    Dispatch,
    Outcome,
    QueueStatistics,
)
from sluicegate.queues.settlement import rewrite
from sluicegate.queues.timed_queues import TimedQueues
from sluicegate.wire.delivery_time import delivery_time
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.redelivery_counts import redelivery_annotations, with_redelivery_counts

# Priorities above this are high (RabbitMQ: ``P > 4``); AMQP's default priority is 4.
NORMAL_PRIORITY: Final = 4
# While both levels wait, every WEIGHT + 1 turns give one to the older of the two heads.
_WEIGHT: Final = 2
# How long at-least-once dead letters some queue did not take wait before they are sent again
# (ms). RabbitMQ's worker waits 3 minutes for a confirm from other nodes; here a queue takes
# or refuses at once, so the wait only spaces the tries while the topology is wrong.
DEAD_LETTER_RETRY_MS: Final = 5_000
# What a kept dead letter costs beyond its message, which the held bytes count already: the
# letter itself, its place in the queue's list and what routing it again keeps alive. Measured
# with 100,000 letters of 100-byte bodies kept for a missing exchange on CPython 3.11: RSS grew
# 30 MiB more than the held bytes did without it (315 bytes a letter), rounded up.
KEPT_LETTER_OVERHEAD: Final = 320


def _stamp_payload(message: Message) -> None:
    """Have a plain message's redelivery counts stamped as it is read, its payload (perhaps a
    fan-out's, shared) kept as it is: checked once here, so that a malformed section raises
    before anything changes."""
    with_redelivery_counts(message.read(), message.returned)
    message.counts = True
    message.view = None


class QuorumOrder:
    """Returns first, in the order they came back; then high and normal priority, two to one.

    Implements :class:`queues.ordering.Ordering`. A durable queue's backlog beyond its resident
    messages waits in pages: they are paged in when both levels are empty, so a high-priority
    message in a page waits for the resident normal ones.
    """

    __slots__ = ("_turn", "backlog", "high", "normal", "returns")

    def __init__(self, backlog: Backlog) -> None:
        self.backlog = backlog
        self.returns: deque[int] = deque()
        self.high: deque[int] = deque()
        self.normal: deque[int] = deque()
        self._turn = 0

    def _seqs(self) -> Iterator[int]:
        """Sequence numbers in serving order, each taken as the walk asks for it."""
        returns = self.returns
        while returns:
            yield returns.popleft()
        high, normal = self.high, self.normal
        while True:
            if not high and not normal:
                backlog = self.backlog
                if not backlog.pages:
                    return
                for message in backlog.page_in():
                    self.add(message)
                continue
            turn = self._turn
            self._turn = 0 if turn == _WEIGHT else turn + 1
            if high and (not normal or turn != _WEIGHT or high[0] < normal[0]):
                yield high.popleft()
            else:
                yield normal.popleft()

    def take(self, limit: int, now: int, taken: list[Message]) -> None:
        """Append up to ``limit`` messages to serve, in order, to ``taken``."""
        if len(taken) < limit:
            self.backlog.collect(self._seqs(), now, limit, taken)

    def next(self, now: int) -> Message | None:
        """The next message to serve."""
        taken: list[Message] = []
        self.take(1, now, taken)
        return taken[0] if taken else None

    def add(self, message: Message) -> None:
        """A new message joins its level (its header's priority), unless a consumer took it."""
        if message.state == AVAILABLE:
            message.priority = message.read_header().priority
            lane = self.high if message.priority > NORMAL_PRIORITY else self.normal
            lane.append(message.seq)

    def requeue(self, message: Message) -> None:
        """A returned message waits at the back of the returns."""
        self.returns.append(message.seq)

    def clear(self) -> None:
        """Forget every available message (purged)."""
        self.returns.clear()
        self.high.clear()
        self.normal.clear()


class QuorumConsumers(Consumers):
    """Consumers as a quorum queue has them: the single active one is of the highest priority.

    When a consumer of higher priority attaches, the active one is *quiescing*: it gets no new
    messages, and the newcomer takes over once it holds nothing unsettled (RabbitMQ 4.0).
    """

    __slots__ = ("quiescing", "successor")

    def __init__(self, single_active: bool) -> None:
        super().__init__(single_active)
        self.quiescing: Consumer | None = None
        self.successor: Consumer | None = None

    def add(self, state: Consumer) -> None:
        """A consumer attached; of higher priority than the active one, it will take over."""
        super().add(state)
        if not self.single_active or state.browse or state.active:
            return
        leader = self.successor or self.active_one()
        if leader is None or state.priority <= leader.priority:
            return
        if self.quiescing is None:
            active = self.active_one()
            if active is not None:
                active.active = False
                self.leave(active)
                self.quiescing = active
        self.successor = state

    def remove(self, key: ConsumerKey) -> Consumer | None:
        """A consumer detached: a successor that leaves gives the turn back."""
        state = super().remove(key)
        if state is None:
            return None
        if state is self.quiescing:
            self.quiescing = None
        elif state is self.successor:
            self.successor = None
            if self.quiescing is not None:
                self.activate(self.quiescing)
                self.quiescing = None
        return state

    def active_one(self) -> Consumer | None:
        """The consumer that receives, on a single-active-consumer queue."""
        for state in self.by_key.values():
            if state.active and not state.browse:
                return state
        return None

    def promote(self) -> None:
        """The active consumer left: the highest priority takes over, first attached first."""
        chosen: Consumer | None = None
        for state in self.by_key.values():
            if not state.browse and (chosen is None or state.priority > chosen.priority):
                chosen = state
        self.successor = None
        if chosen is not None:
            self.activate(chosen)

    def activate(self, state: Consumer) -> None:
        """Make ``state`` the active consumer (it joins the rotation if it has credit)."""
        state.active = True
        if state.credit > 0:
            self.join(state)

    def hand_over(self) -> bool:
        """The successor takes over once the quiescing consumer holds nothing (or left)."""
        successor = self.successor
        if successor is None:
            return False
        quiescing = self.quiescing
        if quiescing is not None and quiescing.unacked:
            return False
        self.quiescing = self.successor = None
        self.activate(successor)
        return True

    def counted(self) -> int:
        """Consumers RabbitMQ counts: the active and a quiescing one, not those waiting."""
        return sum(
            1
            for state in self.by_key.values()
            if not state.browse and (state.active or state is self.quiescing)
        )


class QuorumQueue(ClassicQueue):
    """A quorum queue on one node, implementing :class:`queues.queue_type.QueueType`."""

    def __init__(
        self,
        name: str,
        arguments: QueueArguments,
        *,
        clock: Clock | None = None,
        dead_letters: list[DeadLetter] | None = None,
        held: HeldBytes | None = None,
        timed: TimedQueues | None = None,
    ) -> None:
        super().__init__(
            name, arguments, clock=clock, dead_letters=dead_letters, held=held, timed=timed
        )
        self._order = QuorumOrder(self._backlog)
        self._quorum_consumers = QuorumConsumers(arguments.single_active_consumer)
        self._consumers = self._quorum_consumers
        # At-least-once dead-lettering: letters some queue did not take yet, sent again from
        # the time in ``_retry_at``; they count against the queue's length limits.
        self._kept: deque[DeadLetter] = deque()
        self._kept_bytes = 0
        self._retry_at: int | None = None
        # Messages returned for a later delivery time (x-opt-delivery-time).
        self._delayed = DelayedReturns(self.held)
        if arguments.dead_letter_strategy is DeadLetterStrategy.AT_LEAST_ONCE:
            self._dead_letterer = DeadLetterer(
                name,
                arguments.dead_letter_exchange,
                arguments.dead_letter_routing_key,
                self.dead_letters,
                self._backlog,
                self.held,
                retry=self._keep,
            )

    def enqueue(self, message: Message) -> list[Dispatch]:
        """As a classic queue; dead letters kept for another try count against its limits."""
        kept = self._kept
        if kept:
            max_length = self.arguments.max_length
            max_bytes = self.arguments.max_length_bytes
            backlog = self._backlog
            if (max_length is not None and backlog.ready + len(kept) >= max_length) or (
                max_bytes is not None
                and backlog.ready_bytes + self._kept_bytes + message.read_size() > max_bytes
            ):
                self._overflowed += 1
                raise ResourceLimitExceeded(
                    f"queue '{self.name}' is full: {len(kept)} dead letters wait for their "
                    "dead-letter queues (x-overflow reject-publish, at-least-once)"
                )
        return super().enqueue(message)

    def _keep(self, letter: DeadLetter) -> None:
        """A dead letter some queue did not take: kept (still held at its place in the queue,
        unsettled in the log), and sent again after a while."""
        self._kept.append(letter)
        self._kept_bytes += letter.message.read_size()
        self.held.total += KEPT_LETTER_OVERHEAD
        if self._retry_at is None:
            self._retry_at = self.clock.now + DEAD_LETTER_RETRY_MS
            self.timed.add(self)

    def next_deadline(self) -> int | None:
        """The classic deadlines, the next try of kept dead letters and the next delayed
        return."""
        deadlines = [
            deadline
            for deadline in (super().next_deadline(), self._retry_at, self._delayed.next_deadline())
            if deadline is not None
        ]
        return min(deadlines) if deadlines else None

    def expire(self) -> list[Dispatch]:
        """The classic deadlines; kept dead letters go to the dead-letter exchange again;
        delayed returns whose time came are served."""
        dispatches = super().expire()
        delayed = self._delayed
        due = delayed.due(self.clock.now)
        if due:
            for message in due:
                self._make_available(message)
            dispatches = [*dispatches, *self._dispatch()]
        if len(delayed):
            # The classic deadlines may have left the timed queues: the delayed ones remain.
            self.timed.add(self)
        retry = self._retry_at
        if retry is not None and retry <= self.clock.now:
            self._retry_at = None
            kept = self._kept
            self.dead_letters.extend(kept)
            self.held.total -= len(kept) * KEPT_LETTER_OVERHEAD
            kept.clear()
            self._kept_bytes = 0
        return dispatches

    def persists(self, message: Message) -> bool:
        """Every message of a quorum queue is logged, persistent or not (RabbitMQ's rule)."""
        return True

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """Register a consumer; one of higher priority may take over as the active one."""
        super().attach(consumer, ack_required=ack_required, options=options)
        self._quorum_consumers.hand_over()

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """As a classic queue; a quiescing consumer that leaves hands over at once."""
        dispatches = super().detach(consumer, unsent)
        return self._hand_over(dispatches)

    def give_back(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """As a classic queue; then a waiting successor may take over."""
        return self._hand_over(super().give_back(consumer, unsent))

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
        """As a classic queue settles; then a waiting successor may take over."""
        dispatches = super().settle(
            consumer,
            seqs,
            outcome,
            delivery_failed,
            undeliverable_here=undeliverable_here,
            annotations=annotations,
        )
        return self._hand_over(dispatches)

    def _hand_over(self, dispatches: list[Dispatch]) -> list[Dispatch]:
        """Let a successor take over if it may, and serve it."""
        consumers = self._quorum_consumers
        if consumers.hand_over():
            return [*dispatches, *consumers.dispatch(self._fetch, self._backlog)]
        return dispatches

    def _returned(
        self, returned: list[Message], failed: list[Message], annotations: bytes | None = None
    ) -> None:
        """Count every return against the delivery limit; raise delivery-count for failures;
        hold back what a ``modified`` outcome asked to deliver later."""
        try:
            self._backlog.count_failures(failed, None, self._dead_letterer.send)
        finally:
            limit = self.arguments.delivery_limit
            for message in returned:
                message.returned += 1
                if limit is not None and message.returned > limit and message.state == AVAILABLE:
                    self._dead_letterer.send(message, DELIVERY_LIMIT)
                elif message.state == AVAILABLE:
                    self._stamp_returns(message)
            if annotations is not None:
                self._hold_back(returned, annotations)

    def _stamp_returns(self, message: Message) -> None:
        """Annotate a message that is back with the times it was acquired before
        (wire/redelivery_counts.py), as RabbitMQ's quorum queue does: once per return, never
        per delivery. A plain message's are stamped as it is read (spliced from a cached
        section) and add nothing held; a stored one's are counted like a ``modified``
        outcome's."""
        backlog = self._backlog
        size = message.read_size()
        if type(message) is Message:
            change = partial(_stamp_payload, message)
        else:
            # A stored message keeps consumers' annotations beside its body.
            change = partial(message.annotate, redelivery_annotations(message.returned))
        try:
            rewrite(self.held, message, change)
        except DecodeError:
            # Its own message-annotations section is malformed: it goes out as published.
            return
        backlog.ready_bytes += message.read_size() - size

    def _hold_back(self, returned: list[Message], annotations: bytes) -> None:
        """Keep the returned messages still available out of reach until the outcome's
        ``x-opt-delivery-time``, if it is in the future."""
        due = delivery_time(annotations)
        if due is None or due <= self.clock.now:
            return
        backlog = self._backlog
        delayed = self._delayed
        for message in returned:
            if message.state == AVAILABLE:
                backlog.ready -= 1
                backlog.ready_bytes -= message.read_size()
                delayed.hold(message, due)
        if len(delayed):
            self.timed.add(self)

    def purge(self) -> int:
        """As a classic queue; the delayed returns go too."""
        return super().purge() + self._delayed.clear()

    def _abandoned(self, messages: list[Message]) -> None:
        """Deliveries whose consumer left: returned, not failed (RabbitMQ's ``remove``)."""
        self._returned(messages, [])

    def statistics(self) -> QueueStatistics:
        """As a classic queue's; consumers waiting their turn do not count, as in RabbitMQ."""
        statistics = super().statistics()
        delayed = len(self._delayed)
        if delayed:
            # Still in the queue, only not deliverable yet: a purge or a delete counts them.
            statistics = replace(statistics, ready=statistics.ready + delayed)
        consumers = self._quorum_consumers
        if not consumers.single_active:
            return statistics
        return replace(statistics, consumers=consumers.counted())
