"""The publish path: a publisher's transfers routed to queues, confirmed once stored.

A received delivery becomes an :class:`Unconfirmed` record with one pending copy per target
queue. Each copy borrows one unit from the connection's account. When a queue has stored its
copy (at once for an in-memory queue; after the fsync for a durable one) the queue's owner calls
:meth:`Publishing.confirm`; when the last copy is confirmed the delivery is settled with its
outcome, the link's unconfirmed count drops, and the link may be granted new credit at the next
:meth:`Publishing.flush`. Credit therefore follows storage (notes/rabbitmq-flow.md §6.1).

Above the server's memory budget no publishing link is granted new credit until the bytes held
fall back below the budget's low-water mark (DESIGN §1). Session incoming windows stay open:
proton 0.40 fixes the window API at BEGIN and enforces the older capacity API without a margin,
so shrinking a window under a publisher closes its connection with
``amqp:session:window-violation`` (docs/inbound-flow-control.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

from proton import Condition, Delivery, Endpoint, Link, Receiver

from sluicegate.gateway import deliveries, reading
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.deliveries import CDelivery
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.state import ConnectionState, IncomingLinkState
from sluicegate.gateway.vhost_log import logged_name
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Dispatch, Outcome, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.errors import AmqpError

_DISPOSITIONS: Final[dict[Outcome, int]] = {
    Outcome.ACCEPTED: int(Delivery.ACCEPTED),
    Outcome.RELEASED: int(Delivery.RELEASED),
    Outcome.REJECTED: int(Delivery.REJECTED),
    Outcome.MODIFIED: int(Delivery.MODIFIED),
}


def _close_link(link: Link, condition: str, description: str) -> None:
    """Detach a link with an error condition."""
    link.condition = Condition(condition, description)
    link.close()


class Unconfirmed:
    """A received delivery whose routed copies are not all stored yet."""

    __slots__ = ("condition", "copies", "delivery", "link", "outcome")

    def __init__(self, delivery: CDelivery, link: IncomingLinkState, copies: int) -> None:
        # Held until settled: a durable copy is confirmed after this event is gone.
        deliveries.hold(delivery)
        self.delivery = delivery
        self.link = link
        self.copies = copies
        # The outcome the publisher gets: accepted unless some queue refused its copy.
        self.outcome = Outcome.ACCEPTED
        self.condition: Condition | None = None


def _ignore(link: Link, delivery: Delivery) -> None:
    """Transfers on a link nobody serves (refused, or closing) are dropped with it."""


class Publishing:
    """Every publishing link of a server: receive, route, store, confirm, renew credit."""

    def __init__(
        self,
        config: ServerConfig,
        registry: QueueRegistry,
        budget: MemoryBudget,
        dispatch: Callable[[list[Dispatch]], None],
        durability: Durability | None = None,
    ) -> None:
        self.config = config
        # The default virtual host's registry, whose count of held bytes every registry shares.
        self.registry = registry
        self.budget = budget
        # Deliveries a store handed to consumers at once; the broker marks their sessions.
        self._dispatch = dispatch
        self.links: set[IncomingLinkState] = set()
        # Who gets transfers on receiving links that are not publishers' (set by the broker).
        self.other_link: Callable[[Link, Delivery], None] = _ignore
        # Links whose credit fell to half: renewed once per batch of events (flush), so that a
        # transfer beyond the credit the client was really granted is seen as such.
        self._renew: set[IncomingLinkState] = set()
        # Where persistent messages to durable queues are stored before they are confirmed.
        self.durability = durability
        if durability is not None:
            durability.confirm = self.confirm

    # -- links ----------------------------------------------------------------------------

    def attach(self, link: Link) -> None:
        """Open a publisher's link to what its target names and grant its first credit."""
        connection: ConnectionState = link.connection.sg
        assert connection.vhost is not None
        router = connection.vhost.router
        target = router.resolve(link.remote_target.address)
        pure = IncomingLink(self.config.max_link_credit)
        state = IncomingLinkState(cast(Receiver, link), target, pure, connection, router)
        link.sg = state
        self.links.add(state)
        connection.publishers.add(state)
        link.open()
        credit = pure.attach(self.budget.blocked)
        if credit:
            link.flow(credit)
        else:
            self._renew.add(state)

    def detach(self, state: IncomingLinkState) -> None:
        """Forget a link; copies still being stored are confirmed to nobody."""
        self.links.discard(state)
        self._renew.discard(state)
        state.connection.publishers.discard(state)

    # -- transfers ------------------------------------------------------------------------

    def receive(self, state: IncomingLinkState, delivery: CDelivery) -> None:
        """A transfer from a publisher: refuse it, or route it and store a copy per queue."""
        max_size = self.config.max_message_size
        if deliveries.partial(delivery):
            if deliveries.pending(delivery) > max_size:
                self._refuse_oversized(state, delivery)
            return
        pure = state.link
        if not pure.receive():
            deliveries.settle(delivery)
            _close_link(
                state.receiver,
                "amqp:link:transfer-limit-exceeded",
                "a transfer arrived with no link credit",
            )
            return
        link = state.receiver._impl
        if deliveries.aborted(delivery):
            # It used a credit (AMQP 1.0 §2.6.14) but there is nothing to store.
            deliveries.advance(link)
            deliveries.settle(delivery)
            pure.confirm()
            return
        size = deliveries.pending(delivery)
        if size > max_size:
            self._refuse_oversized(state, delivery)
            return
        payload = deliveries.receive(link, size)
        deliveries.advance(link)
        routed = state.router.route(state.target, payload)
        queues = routed.queues
        pending = Unconfirmed(delivery, state, len(queues))
        if not queues:
            pending.outcome = routed.outcome
            pending.condition = routed.condition
            self._settle(pending)
            return
        if state.connection.account.borrow(len(queues)):
            reading.pause(state.connection)
        message = routed.message
        assert message is not None
        # Copies first: a queue may change its copy (its x-message-ttl) when it stores it.
        copies = [message, *(message.copy() for _ in queues[1:])]
        for queue, copy in zip(queues, copies, strict=True):
            self.store(pending, queue, copy)

    def store(self, pending: Unconfirmed, queue: QueueType, message: Message) -> None:
        """Enqueue one copy; an in-memory queue has stored it once ``enqueue`` returns.

        A queue that refuses it (full, with ``x-overflow = reject-publish``) has the publisher
        told ``rejected`` with the queue's condition. A persistent message to a durable queue
        is stored once the log's fsync covers it: :class:`gateway.durability.Durability`
        confirms it then.
        """
        durability = self.durability
        link = pending.link
        if durability is not None and link.router.registry.persists(queue, message.payload):
            vhost = link.connection.vhost
            assert vhost is not None
            logged = logged_name(vhost.name, queue.name)
            stored = durability.persist(logged, queue.as_stored(message), pending)
            try:
                dispatches = queue.enqueue(stored)
            except AmqpError as error:
                durability.withdraw(stored)
                self.confirm(pending, Outcome.REJECTED, Condition(error.condition, str(error)))
                return
            if dispatches:
                self._dispatch(dispatches)
            return
        try:
            dispatches = queue.enqueue(message)
        except AmqpError as error:
            self.confirm(pending, Outcome.REJECTED, Condition(error.condition, str(error)))
            return
        if dispatches:
            self._dispatch(dispatches)
        self.confirm(pending)

    def confirm(
        self,
        pending: Unconfirmed,
        outcome: Outcome = Outcome.ACCEPTED,
        condition: Condition | None = None,
    ) -> None:
        """One copy of ``pending`` is stored (or refused, with ``outcome`` and ``condition``).

        Repays the copy to the connection's account; the last copy settles the delivery with
        the outcome (``rejected`` if any queue refused it) and frees a place in the link's
        unconfirmed count, so the link may get credit again.
        """
        if outcome is not Outcome.ACCEPTED and pending.outcome is not Outcome.REJECTED:
            pending.outcome = outcome
            pending.condition = condition
        state = pending.link
        connection = state.connection
        if connection.account.repay(1) and not connection.closed:
            reading.resume(connection)
        pending.copies -= 1
        if pending.copies == 0:
            self._settle(pending)

    def _settle(self, pending: Unconfirmed) -> None:
        deliveries.settle_held(pending.delivery, _DISPOSITIONS[pending.outcome], pending.condition)
        state = pending.link
        pure = state.link
        pure.confirm()
        if pure.wants_credit:
            self._renew.add(state)

    def _refuse_oversized(self, state: IncomingLinkState, delivery: CDelivery) -> None:
        deliveries.settle(delivery)
        _close_link(
            state.receiver,
            "amqp:link:message-size-exceeded",
            f"message larger than max-message-size {self.config.max_message_size}",
        )

    # -- credit ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Hand appended records to the log writer, check the memory budget, then renew the
        credit of links that may have more."""
        if self.durability is not None:
            self.durability.flush()
        budget = self.budget
        if budget.update(self.registry.held.total) and not budget.blocked:
            self._renew.update(s for s in self.links if s.link.wants_credit)
        if budget.blocked:
            return
        renew = self._renew
        while renew:
            state = renew.pop()
            receiver = state.receiver
            if receiver.state & Endpoint.LOCAL_ACTIVE:
                grant = state.link.renew()
                if grant:
                    receiver.flow(grant)
