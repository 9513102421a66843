"""The publish path: a publisher's transfers routed to queues, confirmed once stored.

Every decision is the pure inbound session's (``session/inbound.py``): whether a transfer may be
taken, what an unfinished delivery costs, when reads pause, which outcome settles a delivery,
who gets credit and who waits while the memory budget is exhausted. This module reads proton's
deliveries, routes and stores messages, and applies what the session decided.

Session incoming windows stay open: proton 0.40 fixes the window API at BEGIN and enforces the
older capacity API without a margin, so shrinking a window under a publisher closes its
connection with ``amqp:session:window-violation`` (docs/inbound-flow-control.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast
from urllib.parse import quote

from proton import Endpoint, Link, Receiver

from sluicegate.gateway import reading
from sluicegate.gateway.conditions import condition_of
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.confirming import DISPOSITIONS, confirm, settle
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.proton import deliveries, payload_buffers
from sluicegate.gateway.proton.deliveries import CDelivery
from sluicegate.gateway.proton.internals import c_object
from sluicegate.gateway.queue_links import QueueLinks
from sluicegate.gateway.rules.vhost_log import logged_name
from sluicegate.gateway.sending import Sending
from sluicegate.gateway.state import ConnectionState, IncomingLinkState, forget_endpoint
from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.held_bytes import copies_cost
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Dispatch, Outcome, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.remote import RemoteQueue
from sluicegate.session.inbound import (
    CloseConnection,
    CloseLink,
    Inbound,
    Refusal,
    Unconfirmed,
    UnfinishedLimitExceeded,
)
from sluicegate.session.inbound_flow import (
    RELEASE,
    Flushed,
    Hold,
    InboundFlow,
    InboundLimits,
    Release,
    queue_weight,
)
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.errors import AmqpError

__all__ = ["Publishing", "Unconfirmed"]


class Publishing:
    """Every publishing link of a server: receive, route, store, confirm, renew credit."""

    def __init__(
        self,
        config: ServerConfig,
        registry: QueueRegistry,
        budget: MemoryBudget,
        dispatch: Callable[[list[Dispatch]], None],
        queue_links: QueueLinks,
        close_connection: Callable[[ConnectionState, AmqpError], None],
        sending: Sending,
        durability: Durability | None = None,
    ) -> None:
        self.config = config
        # The default virtual host's registry, whose count of held bytes every registry shares.
        self.registry = registry
        self.budget = budget
        self.flow = InboundFlow(
            budget,
            InboundLimits(
                config.max_link_credit,
                config.max_message_size,
                config.unfinished_limit,
                config.unfinished_total_limit,
                config.unfinished_timeout,
                reading.READ_BATCH,
            ),
        )
        # The consumers' unsettled deliveries, which the budget weighs with its publishers
        # (session/unsettled.py), and the sessions that hold or let go their links.
        self.sending = sending
        self.flow.unsettled = sending.unsettled
        # Deliveries a store handed to consumers at once; the broker marks their sessions.
        self._dispatch = dispatch
        self.links: set[IncomingLinkState] = set()
        # Links by their queue, shared with the consumers' (gateway/queue_links.py).
        self.queue_links = queue_links
        # How a connection is closed for an error, what it held given back first.
        self.close_connection = close_connection
        # Bytes handed to transports and metadata of unsettled deliveries (gateway/sending.py).
        # Where persistent messages to durable queues are stored before they are confirmed
        # (gateway/confirming.py confirms them after the fsync).
        self.durability = durability
        # What each queue weighs in this flush's choice of who holds the budget (_weigh).
        self._weights: dict[QueueType, int] = {}

    # -- links ----------------------------------------------------------------------------

    def attach(self, link: Link, queue: str | None = None) -> IncomingLinkState:
        """Open a publisher's link to what its target names (or to ``queue``, which its dynamic
        target made) and grant its first credit."""
        connection: ConnectionState = link.connection.sg
        assert connection.vhost is not None
        router = connection.vhost.router
        address = (
            link.remote_target.address if queue is None else f"/queues/{quote(queue, safe='-._~')}"
        )
        target = router.resolve(address)
        inbound = connection.inbound
        if inbound is None:
            inbound = connection.inbound = Inbound(self.flow, connection.account, connection)
        state = IncomingLinkState(cast(Receiver, link), target, inbound, connection, router)
        credit = state.link.credit
        link.sg = state
        self.links.add(state)
        connection.publishers.add(state)
        if target.queue is not None:
            self.queue_links.add(router.registry, target.queue.name, state, link)
        link.open()
        if credit:
            link.flow(credit)
        return state

    def detach(self, state: IncomingLinkState) -> None:
        """Forget a link; copies still being stored are confirmed to nobody."""
        self.links.discard(state)
        queue = state.target.queue
        if queue is not None:
            self.queue_links.discard(state.router.registry, queue.name, state)
        connection = state.connection
        connection.publishers.discard(state)
        state.partial = None
        inbound = connection.inbound
        if inbound is not None and inbound.detach(state.link) and not connection.closed:
            reading.resume(connection)
        # The pure link and its record point at each other; nothing reads its owner once it
        # is detached (gateway/state.py: no cycle may hold a closed connection).
        state.link.owner = None
        # What still arrives on the link until the client sees its DETACH is discarded.
        forget_endpoint(state.receiver)

    def release(self, connection: ConnectionState) -> None:
        """The connection ended: forget its links and what they charged."""
        for state in list(connection.publishers):
            self.detach(state)
        inbound = connection.inbound
        if inbound is not None:
            inbound.release()
            # Its owner is the connection: unlinked here, the two make no cycle. Confirmations
            # still to come (an fsync) reach the connection through ``Unconfirmed.inbound``.
            connection.inbound = None

    # -- transfers ------------------------------------------------------------------------

    def receive(self, state: IncomingLinkState, delivery: CDelivery) -> None:
        """A transfer from a publisher: refuse it, or route it and store a copy per queue."""
        inbound = state.connection.inbound
        assert inbound is not None
        pure = state.link
        link = c_object(state.receiver)
        if deliveries.partial(delivery):
            # Proton's buffer is drained as frames arrive, so that it never grows to the size
            # of the message (proton keeps a buffer's capacity for the life of its connection).
            partial = state.partial
            if partial is None:
                partial = state.partial = bytearray()
            partial += deliveries.receive(link, delivery, deliveries.pending(delivery))
            refusal = inbound.frame(pure, len(partial))
            if isinstance(refusal, Hold):
                for held in refusal.connections:
                    reading.pause(cast(ConnectionState, held.owner))
            elif refusal is not None:
                state.partial = None
                self._refuse(state, delivery, refusal)
            return
        partial = state.partial
        size = deliveries.pending(delivery)
        total = size if partial is None else len(partial) + size
        refusal = inbound.receive(pure, total, bool(deliveries.aborted(delivery)))
        if refusal is not None:
            state.partial = None
            self._refuse(state, delivery, refusal)
            return
        if partial is None:
            payload = deliveries.receive(link, delivery, size)
        else:
            state.partial = None
            partial += deliveries.receive(link, delivery, size)
            payload = memoryview(partial)
        deliveries.advance(link)
        routed = state.router.route(state.target, payload)
        queues = routed.queues
        # The copies another worker stores count whole here until confirmed: a fan-out's only.
        whole = 0
        if len(queues) > 1:
            whole = sum(1 for queue in queues if type(queue) is RemoteQueue)
        pending, pause = inbound.route(pure, delivery, len(queues), total, whole)
        deliveries.hold(delivery)
        if not queues:
            error = routed.error
            pending.refuse(routed.outcome, error)
            inbound.settled(pending)
            settle(pending)
            if routed.detach:
                assert error is not None
                receiver = state.receiver
                self.detach(state)
                receiver.condition = condition_of(error)
                receiver.close()
            return
        state.queues = queues
        if pause:
            reading.pause(state.connection)
        message = routed.message
        assert message is not None
        if len(queues) == 1:
            self.store(pending, queues[0], message)
            return
        # Each further copy costs the budget its overhead (the payload counts once,
        # queues/held_bytes.py), and one sent to another worker its payload too: charged now
        # as bytes read, so that the copies of one read's messages hold the publishers before
        # the next read rather than at the flush (adversary seed 64103: one read to a fanout
        # of 50 queues went 11 MB past the ceiling when each copy counted its payload).
        further = copies_cost(total, len(queues), whole)
        if not self.flow.fits(further):
            # They would take the publishers past their ceiling at once, where every publisher
            # waits, and for good if nobody reads them: three 70 KB messages read together to
            # a fan-out of 24 queues of another worker went 1.5 MB past it (adversary seed
            # 66100). Stored nowhere, released: the client may send it again (AMQP 1.0 §3.4.4);
            # rejected if they could not fit in the publishers' whole part.
            outcome, error = Outcome.RELEASED, None
            if further >= self.flow.budget.publishing_ceiling:
                outcome, error = (
                    Outcome.REJECTED,
                    ResourceLimitExceeded(
                        f"its {len(queues)} copies would cost {further} bytes, more than the "
                        "server's memory budget lets publishers hold"
                    ),
                )
            for _ in queues:
                confirm(pending, outcome, error)
            return
        self.charge_read(state.connection, further)
        # Copies first: a queue may change its copy (its x-message-ttl) when it stores it.
        copies = [message, *(message.copy() for _ in queues[1:])]
        for queue, copy in zip(queues, copies, strict=True):
            self.store(pending, queue, copy)

    def discard(self, delivery: CDelivery) -> None:
        """A transfer on a link that was refused or is closing: settled and dropped at once.

        Settling makes proton drop the rest of the delivery unread once it has written the
        settlement; until then (for ever, while the client does not read and the server's output
        is full) it goes on buffering its frames, which are dropped as their events come
        (``Settling.on_delivery_of``, gateway/proton/payload_buffers.py), so a client that keeps
        sending on a refused link makes the server hold nothing.
        """
        deliveries.settle(delivery)
        payload_buffers.drop(delivery)

    def store(self, pending: Unconfirmed, queue: QueueType, message: Message) -> None:
        """Enqueue one copy; an in-memory queue has stored it once ``enqueue`` returns.

        A queue that refuses it (full, with ``x-overflow = reject-publish``) has the publisher
        told ``rejected`` with the queue's condition. A persistent message to a durable queue
        is stored once the log's fsync covers it: :class:`gateway.durability.Durability`
        confirms it then.
        """
        if type(queue) is RemoteQueue:
            # Stored by the worker that owns it; confirmed when it says so (docs/workers.md).
            if not queue.publish(pending, message):
                confirm(pending, Outcome.RELEASED)
            return
        durability = self.durability
        link = cast(IncomingLinkState, pending.link.owner)
        if durability is not None and link.router.registry.persists(queue, message):
            vhost = link.connection.vhost
            assert vhost is not None
            logged = logged_name(vhost.name, queue.name)
            stored = durability.persist(logged, queue.as_stored(message), pending)
            try:
                dispatches = queue.enqueue(stored)
            except AmqpError as error:
                durability.withdraw(stored)
                confirm(pending, Outcome.REJECTED, error)
                return
            if dispatches:
                self._dispatch(dispatches)
            return
        try:
            dispatches = queue.enqueue(message)
        except AmqpError as error:
            confirm(pending, Outcome.REJECTED, error)
            return
        if dispatches:
            self._dispatch(dispatches)
        confirm(pending)

    def dispatch(self, dispatches: list[Dispatch]) -> None:
        """Deliveries a store outside a link handed to consumers (the HTTP API's publish)."""
        self._dispatch(dispatches)

    def _give_up(self, state: IncomingLinkState) -> None:
        """The budget released the delivery arriving on the link (session/inbound_flow.py): its
        bytes so far are dropped, and what is left of it as it comes."""
        state.partial = None
        delivery = deliveries.current(c_object(state.receiver))
        if delivery is not None:
            self._refuse(state, delivery, RELEASE)

    def _refuse(self, state: IncomingLinkState, delivery: CDelivery, refusal: Refusal) -> None:
        """Settle the delivery (proton drops the rest of it) and apply the refusal."""
        if isinstance(refusal, Release):
            deliveries.settle_as(delivery, DISPOSITIONS[Outcome.RELEASED])
            payload_buffers.drop(delivery)
            return
        deliveries.settle(delivery)
        payload_buffers.drop(delivery)
        if isinstance(refusal, CloseLink):
            receiver = state.receiver
            self.detach(state)
            receiver.condition = condition_of(refusal.error)
            receiver.close()
        elif isinstance(refusal, CloseConnection):
            self.close_connection(state.connection, refusal.error)

    # -- reading ----------------------------------------------------------------------------

    def charge_read(self, connection: ConnectionState, nbytes: int) -> None:
        """Bytes were read from a connection's socket: charge them, pause whom that holds."""
        inbound = connection.inbound
        if inbound is None:
            return
        for held in self.flow.charge_read(inbound, nbytes):
            reading.pause(cast(ConnectionState, held.owner))

    # -- credit ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Hand appended records to the log writer, then let the inbound session take the bytes
        held, decide who waits, and renew credit."""
        if self.durability is not None:
            self.durability.flush()
        self._weights.clear()
        out = self.flow.flush(
            self.registry.held.total, self.sending.outbound_bytes(), self._weigh, time.monotonic()
        )
        if out is not None:
            self._apply(out)

    def _apply(self, out: Flushed) -> None:
        for inbound in out.pause:
            reading.pause(cast(ConnectionState, inbound.owner))
        for inbound in out.resume:
            connection = cast(ConnectionState, inbound.owner)
            if not connection.closed:
                reading.resume(connection)
        for link, grant in out.grants:
            receiver = cast(IncomingLinkState, link.owner).receiver
            if receiver.state & Endpoint.LOCAL_ACTIVE:
                receiver.flow(grant)
        for link in out.release:
            self._give_up(cast(IncomingLinkState, link.owner))
        if out.hold_consumers or out.let_go_consumers:
            self.sending.hold_unsettled(out.hold_consumers, out.let_go_consumers)
        for inbound in out.close:
            connection = cast(ConnectionState, inbound.owner)
            if not connection.closed:
                self.close_connection(
                    connection,
                    UnfinishedLimitExceeded(
                        f"a delivery made no progress for {self.config.unfinished_timeout:g} s "
                        "while deliveries still arriving were at the server's cap"
                    ),
                )

    def _weigh(self, link: IncomingLink) -> int:
        """What the queues a link published to last (its target's, at first) weigh
        (:func:`queue_weight`). Each queue is weighed once per flush, however many links
        publish to it."""
        state = cast(IncomingLinkState, link.owner)
        queues = state.queues
        if not queues and state.target.queue is not None:
            queues = [state.target.queue]
        weights = self._weights
        weight = 0
        for queue in queues:
            held = weights.get(queue)
            if held is None:
                held = queue_weight(queue)
                if type(queue) is RemoteQueue:
                    # Its bytes are its owner's; what waits for the owner's confirm is ours.
                    held += queue.in_flight()
                weights[queue] = held
            weight += held
        return weight
