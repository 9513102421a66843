"""Proton's endpoint and delivery events, translated into calls on the pure state machines.

Each ``on_*`` pulls plain values out of the event, makes one call on a session or queue, and
applies what comes back. Sessions that have something to send are marked and pumped together
when the reactor runs out of events (:meth:`Broker.flush`), so one socket read of many messages
costs one pass over each session's ``outgoing_pending``.
"""

from __future__ import annotations

import logging
import socket
import time
import weakref
from functools import partial
from typing import Final, cast

from proton import (
    Condition,
    Connection,
    Disposition,
    Endpoint,
    Event,
    Handler,
    Link,
    Sender,
    Session,
    Terminus,
)

from sluicegate.gateway import deliveries, payload_buffers, timeouts
from sluicegate.gateway.access import authorise_attach, authorise_reply_to, authorise_temporary
from sluicegate.gateway.auth import Access
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.consumers import consumer_options
from sluicegate.gateway.deliveries import CDelivery
from sluicegate.gateway.disposition_bound import Copies, DispositionBound
from sluicegate.gateway.drain import send_drained_flow
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.dynamic import Declare, dynamic_source, dynamic_target
from sluicegate.gateway.events import (
    connection_of,
    delivery_of,
    link_of,
    session_of,
    transport_of,
)
from sluicegate.gateway.expiry import ExpiryTimer
from sluicegate.gateway.heap_trim import HeapTrimmer
from sluicegate.gateway.identity import open_properties
from sluicegate.gateway.limits import (
    AttachDataExceeded,
    Handshakes,
    SessionLimitExceeded,
    check_connections,
    link_attached,
    link_detached,
    session_ended,
)
from sluicegate.gateway.management.node import ManagementNode, management_caller
from sluicegate.gateway.management.router import Response, Router
from sluicegate.gateway.modified_outcomes import ModifiedAnnotations
from sluicegate.gateway.proton_internals import c_object, reactor_now
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.queue_links import QueueLinks
from sluicegate.gateway.renewal import renew_credential
from sluicegate.gateway.settle_modes import refuse_unhonoured, state_settle_modes
from sluicegate.gateway.settlement_run import NO_OUTCOME, SettlementRun
from sluicegate.gateway.state import (
    RECORD,
    ConnectionState,
    IncomingLinkState,
    OutgoingLinkState,
    SessionState,
    forget,
    forget_endpoint,
    forget_session,
)
from sluicegate.gateway.tenancy import NotAllowed, Tenancy, VirtualHost
from sluicegate.queues.errors import ResourceLocked
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import (
    ConsumerOptions,
    Dispatch,
    LockExpired,
    Outcome,
    QueueType,
)
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.volatile import VolatileQueue
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.outgoing_link import LinkOwner, OutgoingLink
from sluicegate.session.session import (
    UNSETTLED_DELIVERY_COST,
    LinkFlow,
    TransferPart,
    Unsettled,
    resume,
    route,
)
from sluicegate.session.session import Session as PureSession
from sluicegate.session.waiting import Waiting
from sluicegate.wire.addresses import parse_address
from sluicegate.wire.annotations import InvalidAnnotations
from sluicegate.wire.errors import AmqpError
from sluicegate.writer.writer import ServerBytes

log = logging.getLogger("sluicegate")

_OUTCOMES: Final[dict[int, Outcome]] = {
    Disposition.ACCEPTED: Outcome.ACCEPTED,
    Disposition.RELEASED: Outcome.RELEASED,
    Disposition.REJECTED: Outcome.REJECTED,
    Disposition.MODIFIED: Outcome.MODIFIED,
}


def _close(endpoint: Connection | Session | Link, condition: str, description: str) -> None:
    endpoint.condition = Condition(condition, description)
    endpoint.close()


class Broker(Handler):
    """The server's reactor handler: every connection's endpoints and deliveries."""

    def __init__(
        self, config: ServerConfig, tenancy: Tenancy, durability: Durability | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.tenancy = tenancy
        # The default virtual host's registry.
        registry = self.registry = tenancy.default.registry
        self.connections: set[ConnectionState] = set()
        # Connections that have not sent their OPEN yet, among ``connections``.
        self.handshakes = Handshakes(config.max_unauthenticated_connections)
        self._dirty: set[SessionState] = set()
        # Connections with unsettled deliveries whose payload buffers are to be given back.
        self._unframed: set[ConnectionState] = set()
        # Keys for consumer links within their session; proton does not expose handles.
        self._handles = 0
        self._states: dict[LinkOwner, SessionState] = {}
        self._open_properties = open_properties(config.rabbitmq_compatible)
        # Named as RabbitMQ names its nodes: clients show and compare queue leaders by it, and
        # the HTTP API reports it.
        node = self.node = f"rabbit@{socket.gethostname()}"
        budget = MemoryBudget(config.memory_budget)
        self.management = ManagementNode(
            {
                vhost.registry: Router(vhost.registry, node=node, vhost=vhost.name, quotas=vhost)
                for vhost in tenancy.vhosts.values()
            },
            self.queue_deleted,
            budget,
            self._renew_credential,
        )
        # Consumer and publisher links by their queue, for the queue's deletion.
        self.queue_links = QueueLinks()
        self.publishing = Publishing(
            config,
            registry,
            budget,
            self._route,
            self.queue_links,
            durability,
        )
        self.expiry = ExpiryTimer(
            [vhost.registry for vhost in tenancy.vhosts.values()], self._route, self.queue_deleted
        )
        self.publishing.other_link = self.management.on_request
        # What consumer filters decoded of messages, shared by every filter of the server.
        self.filter_views = ViewCache()
        self.publishing.close_connection = self.close_for_error
        self.publishing.outbound = self.outbound_bytes
        # Bytes every connection's writer handed to proton and that are not written yet.
        self.pending_bytes = ServerBytes()
        # Unsettled deliveries to consumers, over every session.
        self.unsettled = Unsettled()
        # What proton may copy of the DISPOSITIONs it is handed in a pass (gateway/feeding.py).
        self.disposition_copies = Copies(self._budget_room)
        # Consecutive settlements of one consumer link, applied together.
        self.settlements = SettlementRun()
        # The annotations of consumers' modified outcomes, checked once per range.
        self.modified_annotations = ModifiedAnnotations(
            config.max_message_annotations_size, self.publishing.budget, registry.held
        )
        # What deliveries waiting in every connection's sessions hold (session/waiting.py).
        self.waiting = ServerBytes()
        # Gives the heap's freed pages back after large releases (gateway/heap_trim.py).
        self.trimmer = HeapTrimmer()
        # Every connection's record, open or closed, until it is freed: what a closed
        # connection leaves behind shows here (tests/integration/test_connection_leaks.py).
        self.records: weakref.WeakSet[ConnectionState] = weakref.WeakSet()

    # -- connections ----------------------------------------------------------------------

    def accept(self, state: ConnectionState) -> None:
        """A client connected: its writer and its sessions' waiting deliveries count toward the
        server's outbound bytes."""
        state.writer.pending = self.pending_bytes
        state.waiting = Waiting(self.config.max_outgoing_pending_size, self.waiting)
        state.dispositions = DispositionBound(self.disposition_copies, self.release_connection)
        self.connections.add(state)
        self.records.add(state)

    def _budget_room(self) -> int:
        """What the memory budget has left now (gateway/disposition_bound.py)."""
        budget = self.publishing.budget
        used = self.registry.held.total + self.outbound_bytes() + budget.unfinished
        return budget.limit - used

    def outbound_bytes(self) -> int:
        """What consumers make the server hold beyond the queued messages: deliveries waiting in
        sessions, bytes handed to proton and not yet written, and the bookkeeping of unsettled
        deliveries."""
        return (
            self.waiting.total
            + self.pending_bytes.total
            + self.unsettled.count * UNSETTLED_DELIVERY_COST
        )

    def on_connection_remote_open(self, event: Event) -> None:
        """Answer OPEN with our identity and let the connection into its virtual host.

        Proton negotiates frame size and channels. A connection refused here (a server or
        vhost limit, a virtual host it may not enter) gets its OPEN and then a CLOSE saying why,
        but for one refused its virtual host with ``rabbitmq_compatible`` on: that one is
        dropped without OPEN or CLOSE, the reason logged, as RabbitMQ's reader drops it (its
        OPEN handling fails the handshake, ``rabbit_amqp_reader``). RabbitMQ's Python client
        takes a CLOSE for a lost connection and reconnects from its handler without end; a
        connection dropped before OPEN makes it raise.
        """
        connection = connection_of(event)
        state: ConnectionState = connection.sg
        self.handshakes.finished(state)
        transport = state.transport
        if self.config.rabbitmq_compatible:
            try:
                self.tenancy.check_entry(state.user, connection.remote_hostname)
            except NotAllowed as error:
                log.warning("dropping a connection at its OPEN: %s", error)
                self.release_connection(state)
                transport.close_tail()
                transport.close_head()
                return
        connection.properties = self._open_properties
        connection.open()
        # Proton announces the idle timeout in the OPEN it encodes now; from then on
        # gateway/timeouts.py enforces it, counting whole frames only.
        transport.pending()
        transport.idle_timeout = 0.0
        timeouts.opened(state, reactor_now(state.selectable), self.config.idle_timeout)
        try:
            check_connections(len(self.connections) - self.handshakes.pending, self.config)
            admission = self.tenancy.admit(state.user, connection.remote_hostname)
        except AmqpError as error:
            _close(connection, error.condition, str(error))
            return
        state.vhost = admission.vhost
        state.permissions = admission.permissions
        user = state.user
        if user is not None and user.expires_at is not None:
            now = reactor_now(state.selectable)
            timeouts.credential(state, now, user.expires_at - time.time())

    def on_connection_remote_close(self, event: Event) -> None:
        """The client closed: give back what it held and answer CLOSE."""
        connection = connection_of(event)
        state: ConnectionState | None = getattr(connection, "sg", None)
        if state is not None:
            self.release_connection(state)
        connection.close()

    def on_transport_closed(self, event: Event) -> None:
        """The socket is gone, with or without CLOSE: nothing of it may stay acquired, and
        nothing of it may stay in proton's records (gateway/state.py)."""
        state: ConnectionState | None = getattr(transport_of(event).connection, "sg", None)
        if state is not None:
            self.release_connection(state)
            forget(state)

    def release_connection(self, state: ConnectionState) -> None:
        """End every session of a connection once, returning its messages to their queues."""
        if state.closed:
            return
        state.closed = True
        held = self.outbound_bytes()
        self.connections.discard(state)
        self.handshakes.finished(state)
        for session in list(state.sessions.values()):
            self._end_session(session)
        self.publishing.release(state)
        for link in list(state.temporary):
            self._delete_temporary(state, link)
        self.management.release(state)
        state.fresh_links.clear()
        if state.vhost is not None:
            assert state.user is not None
            self.tenancy.leave(state.user, state.vhost)
        state.writer.close()
        if state in self._unframed:
            self._give_back_buffers()
        # What it held (its unsettled deliveries in proton above all, and proton's pool of
        # those its ended sessions held) is freed with its record.
        released = max(held - self.outbound_bytes(), state.pooled)
        if released > 0:
            weakref.finalize(state, self.trimmer.freed, released).atexit = False

    def close_for_error(self, state: ConnectionState, condition: str, description: str) -> None:
        """Close a connection that broke a limit: what it held goes back first.

        Nothing more is read from it: proton would otherwise go on filling the buffers of the
        deliveries it had begun (it gives them up only after writing their dispositions, which
        it no longer does once its CLOSE is out), for as long as the client keeps sending.
        """
        self.release_connection(state)
        _close(state.connection, condition, description)
        transport = state.transport
        transport.pending()  # the CLOSE is framed with its condition before the input ends
        transport.close_tail()

    # -- sessions -------------------------------------------------------------------------

    def on_session_remote_open(self, event: Event) -> None:
        """A BEGIN: pair the proton session with a pure outbound session.

        A session over its user's limit is refused: BEGIN answered, then END with the reason.
        """
        session = session_of(event)
        connection: ConnectionState = session.connection.sg
        if connection.vhost is None or connection.closed:
            return  # frames pipelined after an OPEN that was refused
        assert connection.user is not None
        try:
            self.tenancy.begin_session(connection.user)
        except AmqpError as error:
            session.open()
            _close(session, error.condition, str(error))
            return
        # Parts of a message are cut at our own max-frame-size at most, whatever the client's.
        max_frame_size = self.config.max_frame_size
        remote = connection.transport.remote_max_frame_size
        pure = PureSession(
            connection.writer,
            max_queue_credit=self.config.max_queue_credit,
            max_frame_size=min(remote, max_frame_size) if remote else max_frame_size,
            unsettled=self.unsettled,
            waiting=connection.waiting,
        )
        state = SessionState(connection, session, pure)
        connection.sessions[pure.writer_credit] = state
        self._states[pure] = state
        session.sg = state
        session.open()

    def on_session_remote_close(self, event: Event) -> None:
        """An END: its links are gone and their messages go back."""
        session = session_of(event)
        state: SessionState | None = getattr(session, "sg", None)
        if state is not None:
            held = self.outbound_bytes()
            self._end_session(state)
            # Proton frees the session's links now, whoever ended it first.
            session_ended(state)
            # Proton keeps the structs of freed deliveries in a pool for its connection's life.
            pooled = held - self.outbound_bytes()
            state.connection.pooled = max(state.connection.pooled, pooled)
        session.close()
        # Proton gives the session's channel back only once our END is encoded, and encodes
        # only when it writes: a client that reuses its channel for BEGIN/END pairs in one
        # burst would otherwise have proton run out of channels and stop answering.
        transport = session.connection.transport
        if transport is not None:
            transport.pending()
        # Unless freed, proton keeps an ended session, its links and every delivery they sent
        # for as long as the connection lives (80 MiB for 100,000 unsettled). Freed, they go
        # once proton is done with them; their records go first, as they refer to them.
        forget_session(session)
        session.free()

    def _end_session(self, state: SessionState) -> None:
        if state.pure.writer_credit not in state.connection.sessions:
            return
        connection = state.connection
        del connection.sessions[state.pure.writer_credit]
        assert connection.user is not None
        assert connection.vhost is not None
        self.tenancy.end_session(connection.user)
        self._dirty.discard(state)
        queues = [sender.link.queue for sender in state.senders.values()]
        # The temporary queues its links made, found before its links are let go.
        temporary = [
            made
            for made in connection.temporary
            if made in state.senders
            or (
                isinstance(made, IncomingLinkState)
                and getattr(made.receiver.session, RECORD, None) is state
            )
        ]
        for publisher in [p for p in connection.publishers if p.receiver.session == state.session]:
            self.publishing.detach(publisher)
        registry = connection.vhost.registry
        for sender in state.senders:
            self.queue_links.discard(registry, sender.queue.name, sender)
        self._route(state.pure.end())
        self.management.end_session(state)
        del self._states[state.pure]
        # Its links' records point back at it: emptied, they hold it no more (a cycle would
        # keep the connection's proton objects until a full collection, gateway/state.py).
        state.senders.clear()
        for queue in queues:
            registry.consumer_left(queue)
            self.management.consumer_left(
                registry, queue, self.queue_links.consumers(registry, queue.name)
            )
        # They go with their links, as at a DETACH (the publishers were detached above).
        for made in temporary:
            self._delete_temporary(connection, made)
        self._resume(connection)

    # -- links ----------------------------------------------------------------------------

    def on_link_remote_open(self, event: Event) -> None:
        """An ATTACH: echo both termini, then serve the queue the address names or refuse."""
        link = link_of(event)
        session: SessionState | None = getattr(link.session, "sg", None)
        if session is None:
            return  # frames pipelined after a refused OPEN or BEGIN
        connection = session.connection
        if connection.closed:
            return  # frames read in the same pass as the CLOSE or the error that ended it
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        state_settle_modes(link)
        try:
            link_attached(session, link, self.config)
            management = self.management.is_management(link)
            refuse_unhonoured(link, management)
            if management:
                assert connection.vhost is not None
                self.management.attach(
                    link, management_caller(connection), connection.vhost.registry
                )
                return
            vhost = connection.vhost
            assert vhost is not None
            authorise_attach(connection.user, connection.permissions, link, vhost)
            if link.is_sender:
                self._attach_consumer(link, vhost)
            elif link.remote_target.dynamic:
                name = dynamic_target(link, self._temporary(connection, vhost, "write"))
                try:
                    state = self.publishing.attach(link, name)
                except Exception:
                    self._delete_dynamic(vhost.registry, name)
                    raise
                connection.temporary[state] = (vhost.registry, name)
            else:
                self.publishing.attach(link)
        except AttachDataExceeded as error:
            self.close_for_error(connection, error.condition, str(error))
        except SessionLimitExceeded as error:
            self._end_session(session)
            _close(link.session, error.condition, str(error))
        except AmqpError as error:
            # The refusal of §2.6.3: a null terminus in the reply, then a DETACH with the error.
            terminus = link.source if link.is_sender else link.target
            terminus.type = Terminus.UNSPECIFIED
            link.open()
            _close(link, error.condition, str(error))

    def _attach_consumer(self, link: Link, vhost: VirtualHost) -> None:
        registry = vhost.registry
        session: SessionState = link.session.sg
        queue: QueueType
        temporary: str | None = None
        if link.remote_source.dynamic:
            # Its options are read before its node is made: a refused attach leaves nothing.
            options = consumer_options(link, self.filter_views, registry.clock)
            connection = session.connection
            declare = self._temporary(connection, vhost, "read")
            queue, temporary = dynamic_source(
                link,
                registry,
                declare,
                partial(authorise_reply_to, connection.user, connection.permissions),
            )
            if isinstance(queue, VolatileQueue):
                budget = self.publishing.budget
                waiting = connection.waiting
                queue.backlogged = lambda: waiting.backlogged(budget.blocked)
            try:
                self._open_consumer(link, session, registry, queue, options, temporary)
            except Exception:
                self._delete_dynamic(registry, queue.name)
                raise
            return
        address = parse_address(link.remote_source.address)
        owner = registry.owner(address.queue)
        if owner is not None and owner is not session.connection:
            # RabbitMQ's wording: only the declaring connection consumes an exclusive queue.
            raise ResourceLocked(
                f"cannot obtain exclusive access to locked queue '{address.queue}' "
                f"in vhost '{vhost.name}'"
            )
        queue = registry.declare(address.queue, create=self.config.attach_declares_queues)
        options = consumer_options(
            link,
            self.filter_views,
            registry.clock,
            indexes_filter_values=isinstance(queue, StreamQueue),
        )
        self._open_consumer(link, session, registry, queue, options, None)

    def _open_consumer(
        self,
        link: Link,
        session: SessionState,
        registry: QueueRegistry,
        queue: QueueType,
        options: ConsumerOptions,
        temporary: str | None,
    ) -> None:
        """Attach a consumer's link to its queue; ``temporary`` names the queue its dynamic
        source made, to delete when the link detaches."""
        ack_required = link.remote_snd_settle_mode != Link.SND_SETTLED
        self._handles += 1
        pure_link = session.pure.attach_link(
            self._handles, queue, ack_required=ack_required, options=options
        )
        state = OutgoingLinkState(cast(Sender, link), pure_link, session)
        session.senders[pure_link] = state
        self.queue_links.add(registry, queue.name, pure_link, link)
        link.sg = state
        if temporary is not None:
            session.connection.temporary[pure_link] = (registry, temporary)
        session.connection.fresh_links.append(state)
        link.open()

    def _temporary(
        self, connection: ConnectionState, vhost: VirtualHost, access: Access
    ) -> Declare:
        """How a link's dynamic terminus declares its temporary queue (gateway/dynamic.py)."""

        def declare(name: str) -> QueueType:
            authorise_temporary(connection.user, connection.permissions, vhost, name, access)
            return vhost.registry.declare_queue(name, exclusive=True, owner=connection)

        return declare

    def _delete_dynamic(self, registry: QueueRegistry, name: str) -> None:
        """An attach was refused after its dynamic source or target made a node: it goes."""
        registry.remove_volatile(name)
        if registry.get(name) is not None:
            registry.delete_queue(name)
            self.queue_deleted(registry, name)

    def _delete_temporary(self, connection: ConnectionState, link: object) -> None:
        """A link that made a temporary queue is gone: so is the queue, as in RabbitMQ."""
        made = connection.temporary.pop(link, None)
        if made is not None:
            registry, name = made
            registry.delete_queue(name)
            self.queue_deleted(registry, name)

    def _renew_credential(self, state: ConnectionState, method: str, body: object) -> Response:
        """``PUT /auth/tokens`` (gateway/renewal.py). As RabbitMQ does, the links the renewed
        token no longer allows are detached with ``amqp:unauthorized-access``."""
        response = renew_credential(
            state,
            method,
            body,
            self.config.oauth2,
            wall_now=time.time(),
            now=reactor_now(state.selectable),
        )
        vhost = state.vhost
        if response.status != 204 or vhost is None:
            return response
        refused: list[tuple[Link, str]] = []
        link = state.connection.link_head(Endpoint.LOCAL_ACTIVE)
        while link is not None:
            if isinstance(getattr(link, "sg", None), OutgoingLinkState | IncomingLinkState):
                try:
                    authorise_attach(state.user, state.permissions, link, vhost)
                except AmqpError as error:
                    refused.append((link, str(error)))
            link = link.next(Endpoint.LOCAL_ACTIVE)
        for gone, description in refused:
            self._detach(gone)
            _close(gone, "amqp:unauthorized-access", description)
        return response

    def queue_deleted(self, registry: QueueRegistry, name: str) -> None:
        """Detach every link of a deleted queue with ``amqp:resource-deleted``, as RabbitMQ does.

        Consumers' unsettled messages go back to the deleted queue object and die with it.
        ``registry`` is its virtual host's: other virtual hosts may have queues of that name.
        """
        condition = "amqp:resource-deleted"
        description = f"queue '{name}' was deleted"
        for link in self.queue_links.take(registry, name):
            self._detach(link)
            _close(link, condition, description)

    def on_link_remote_close(self, event: Event) -> None:
        """A DETACH: release what the link held and answer it."""
        link = link_of(event)
        link_detached(link)
        held = self.outbound_bytes()
        self._detach(link)
        link.close()
        session: SessionState | None = getattr(link.session, "sg", None)
        if session is not None:
            connection = session.connection
            connection.pooled = max(connection.pooled, held - self.outbound_bytes())
        # Unless freed, proton keeps a detached link and every delivery it sent until its
        # session ends (80 MiB for 100,000 unsettled): freed as an ended session is.
        forget_endpoint(link)
        link.free()

    on_link_remote_detach = on_link_remote_close

    def _detach(self, link: Link) -> None:
        state = getattr(link, "sg", None)
        if isinstance(state, OutgoingLinkState):
            state.session.senders.pop(state.link, None)
            self._route(state.session.pure.detach_link(state.link))
            connection = state.session.connection
            vhost = connection.vhost
            assert vhost is not None
            registry, queue = vhost.registry, state.link.queue
            self.queue_links.discard(registry, queue.name, state.link)
            registry.consumer_left(queue)
            self.management.consumer_left(
                registry, queue, self.queue_links.consumers(registry, queue.name)
            )
            self._delete_temporary(connection, state.link)
            self._resume(connection)
        elif isinstance(state, IncomingLinkState):
            self.publishing.detach(state)
            self._delete_temporary(state.connection, state)

    def on_link_flow(self, event: Event) -> None:
        """Maybe a client FLOW on a consumer link: the session tells (``transport_flow``).

        A FLOW for a link the server has detached (its queue was deleted, the client has not
        read the DETACH yet) is ignored: the DETACH answers it. A FLOW that came with the
        ATTACH waits until the socket has taken the ATTACH reply (:meth:`attaches_written`).
        """
        link = link_of(event)
        state = getattr(link, "sg", None)
        if (
            not isinstance(state, OutgoingLinkState)
            or state.link.detached
            or not state.attach_written
        ):
            return
        self._credit(link, state)

    def attaches_written(self, connection: ConnectionState) -> None:
        """The socket took the ATTACH replies of the connection's new consumer links.

        Their credit counts from now on, so a link's first message never goes out in the same
        write as its ATTACH reply: with RabbitMQ, whose queues answer credit only after the
        session has sent the ATTACH, a client that blocks until its link is open (the blocking
        API of RabbitMQ's Python client, which grants credit with its ATTACH) gets its first
        message once it handles messages, not inside the call that opens the link.
        """
        fresh = connection.fresh_links
        connection.fresh_links = []
        for state in fresh:
            state.attach_written = True
            if not state.link.detached and not connection.closed:
                self._credit(state.sender, state)

    def _credit(self, link: Link, state: OutgoingLinkState) -> None:
        pending = state.drain_pending
        if pending is not None:
            if state.link.flow_changed(link.credit, link.drain_mode):
                # A client FLOW came in before proton could send the drained one, and proton
                # holds its credit already: draining now would drain that credit too, while
                # the queue may hold messages for it. The later FLOW is acted on instead.
                state.drain_pending = None
                state.link.drain_withdrawn(pending.drained)
            else:
                self._complete_drain(state)
        pure = state.session.pure
        if pure.transport_flow(state.link, link.credit, link.drain_mode, link.unsettled):
            self._dirty.add(state.session)

    # -- deliveries -----------------------------------------------------------------------

    def on_delivery(self, event: Event) -> None:
        """A transfer from a publisher, or a consumer's settlement (through proton's dispatch,
        which has no other events to apply a run of settlements before)."""
        self.on_delivery_of(c_object(delivery_of(event)))
        self.apply_settlements()

    def on_delivery_of(self, delivery: CDelivery) -> None:
        """The delivery event's work, called by the reactor with proton's bare delivery.

        Consumers' settlements gather in :attr:`settlements` (``gateway/settlement_run.py``),
        which takes the events that continue its run itself; the reactor has them applied
        before it dispatches any other event.
        """
        run = self.settlements
        if run.seqs and deliveries.link(delivery) == run.link:
            assert run.state is not None
            self._settled(run.state, delivery)
            return
        state = deliveries.link_state(delivery)
        if type(state) is OutgoingLinkState:
            self._settled(state, delivery)
            return
        self.apply_settlements()
        if type(state) is IncomingLinkState:
            self.publishing.receive(state, delivery)
        elif state is None:
            # A link refused at attach or detached since: what still arrives is dropped.
            if deliveries.on_receiver(delivery):
                self.publishing.discard(delivery)
        else:
            # The management node's.
            wrapped = deliveries.wrap(delivery)
            link = wrapped.link
            if link.is_receiver:
                self.publishing.other_link(link, wrapped)

    def _settled(self, state: OutgoingLinkState, delivery: CDelivery) -> None:
        remote = deliveries.remote_state(delivery)
        outcome = _OUTCOMES.get(remote)
        if outcome is None:
            if not deliveries.settled(delivery):
                return
            outcome = Outcome.ACCEPTED
            remote = NO_OUTCOME
        run = self.settlements
        if outcome is Outcome.MODIFIED:
            self.apply_settlements()
            self._modified(state, delivery)
            return
        if run.state is not state or run.outcome is not outcome:
            self.apply_settlements()
            run.start(deliveries.link(delivery), state, outcome, remote)
        run.seqs.append(deliveries.tag_number(delivery))
        deliveries.settle(delivery)

    def apply_settlements(self) -> None:
        """Hand the run of settlements gathered so far to its session and queue."""
        taken = self.settlements.take()
        if taken is None:
            return
        state, outcome, seqs = taken
        try:
            dispatches = state.session.pure.settle(state.link, seqs, outcome, False)
        except LockExpired as error:
            self._lock_expired(state, error)
            return
        if dispatches:
            self._route(dispatches)

    def _modified(self, state: OutgoingLinkState, delivery: CDelivery) -> None:
        """A ``modified`` outcome, with its own fields: applied alone."""
        try:
            dispatches = state.session.pure.settle(
                state.link,
                [deliveries.tag_number(delivery)],
                Outcome.MODIFIED,
                deliveries.remote_failed(delivery),
                undeliverable_here=deliveries.remote_undeliverable(delivery),
                annotations=self.modified_annotations.checked(
                    deliveries.remote_annotations(delivery)
                ),
            )
        except InvalidAnnotations as error:
            # Nothing was settled: the message goes back when the link detaches. Proton lets
            # go of the delivery and its copy of the annotations.
            deliveries.settle(delivery)
            self._detach(state.sender)
            _close(state.sender, error.condition, str(error))
            return
        except LockExpired as error:
            deliveries.settle(delivery)
            self._lock_expired(state, error)
            return
        deliveries.settle(delivery)
        if dispatches:
            self._route(dispatches)

    def _lock_expired(self, state: OutgoingLinkState, error: LockExpired) -> None:
        """A settlement came after a delivery's lock expired: the message went back then, the
        late settlement changed nothing, and the consumer learns why (RabbitMQ closes on its
        consumer timeout too)."""
        self._route(error.dispatches)
        self._detach(state.sender)
        _close(state.sender, error.condition, str(error))

    # -- sending --------------------------------------------------------------------------

    def _route(self, dispatches: list[Dispatch]) -> None:
        states = self._states
        for pure in route(dispatches):
            self._dirty.add(states[pure])

    def _resume(self, connection: ConnectionState) -> None:
        """Once enough has left a connection's sessions, make its deferred credit requests."""
        if connection.waiting.resumable and not connection.closed:
            states = self._states
            for pure in resume(connection.waiting):
                self._dirty.add(states[pure])

    def mark(self, session: SessionState) -> None:
        """Have a session pumped at the next flush."""
        self._dirty.add(session)

    def flush(self) -> None:
        """Renew publisher credit, pump every session that has something new to send, and
        give the heap back after a large release."""
        # The pass's events are handled: proton's copies of its DISPOSITIONs' outcomes are gone.
        self.disposition_copies.forget()
        self._route_dead_letters()
        # Every virtual host's registry shares one count of bytes held (gateway/server.py).
        held = self.registry.held.total
        self.publishing.flush()
        self.modified_annotations.forget()
        dirty = self._dirty
        while dirty:
            state = dirty.pop()
            self.pump(state)
            self._resume(state.connection)
        if self._unframed:
            self._give_back_buffers()
        self.trimmer.flush(held, time.monotonic())

    def _route_dead_letters(self) -> None:
        """Route a batch of every virtual host's pending dead letters, within the budget.

        Their copies are held like a publisher's messages: while the memory budget is blocked
        no copy that grows what it counts is made (the letters wait, their messages held at
        their place, counted), and a pass grows it by at most its headroom
        (queues/dead_lettering.py). Letters left past a pass's batch make the expiry timer come
        back at the next pass of the reactor; those waiting for room, at its next interval.
        """
        budget = self.publishing.budget
        left = False
        for vhost in self.tenancy.vhosts.values():
            registry = vhost.registry
            if not registry.dead_letters:
                continue
            room = 0
            if not budget.blocked:
                used = self.registry.held.total + self.outbound_bytes() + budget.unfinished
                room = max(0, budget.limit - used)
            self._route(registry.route_dead_letters(room))
            router = registry.dead_letter_router
            left = left or (bool(router.outbox) and not router.waiting)
            failures = router.failures
            for failure in failures:
                log.error(
                    "dead-lettering %s of queue '%s' failed (%s): %s",
                    failure.message,
                    failure.queue,
                    failure.error,
                    "it stays at its place in its queue, not delivered, until the queue is "
                    "purged or deleted or the server restarts"
                    if failure.kept
                    else "it is lost (purged, or refused at publish)",
                )
            failures.clear()
        if left:
            self.expiry.soon()

    def _give_back_buffers(self) -> None:
        """Free the payload buffers of unsettled deliveries proton has framed since.

        Proton frames what it may send when asked for its output; a delivery still waiting
        for the client's window is looked at again after the next pump.
        """
        for connection in list(self._unframed):
            framing = not connection.closed
            if framing:
                connection.transport.pending()
            connection.unframed = payload_buffers.give_back(
                connection.unframed, connection.sent, framing
            )
            connection.sent = []
            if not connection.unframed:
                self._unframed.discard(connection)

    def pump(self, state: SessionState) -> None:
        """Hand the session's sendable deliveries and FLOWs to proton."""
        if state.connection.closed:
            return
        state.refresh_window()
        senders = state.senders
        # proton's C calls per message, bound once a pump (gateway/deliveries.py): a function
        # of our own around them cost as much again as the calls.
        new_delivery = deliveries.new_delivery
        write = deliveries.write
        advance = deliveries.advance
        settle = deliveries.settle
        from_buffer = deliveries.from_buffer
        keep = payload_buffers.KEEP
        sent = state.connection.sent
        # Whole deliveries come in runs of one link: its sender and settle mode are looked up
        # once a run, and the transport is told of the run's deliveries at its end.
        link: OutgoingLink | None = None
        sender = None
        ack = False
        run = 0
        try:
            for action in state.pure.send_pending():
                if type(action) is tuple:
                    if action[0] is not link:
                        if run and link is not None:
                            link.transport_sent(run)
                            run = 0
                        link = action[0]
                        sender = c_object(senders[link].sender)
                        ack = link.ack_required
                    message = action[1]
                    # A plain message's bytes are its payload; a stored one reads them.
                    payload = message.payload if type(message) is Message else message.send()
                    tag = b"%d" % message.seq
                    delivery = new_delivery(sender, (len(tag), from_buffer(tag)))
                    # cffi passes bytes to a char * as they are; other buffers need a view.
                    write(
                        sender,
                        payload if type(payload) is bytes else from_buffer(payload),
                        len(payload),
                    )
                    advance(sender)
                    run += 1
                    if not ack:
                        settle(delivery)
                    elif len(payload) > keep:
                        sent.append(delivery)
                    continue
                if run and link is not None:
                    link.transport_sent(run)
                    run = 0
                if type(action) is TransferPart:
                    self._send_part(senders[action.link], action)
                else:
                    assert isinstance(action, LinkFlow)
                    self._send_link_flow(senders.get(action.link), action)
        finally:
            if run and link is not None:
                link.transport_sent(run)
            if sent:
                self._unframed.add(state.connection)

    def _send_part(self, state: OutgoingLinkState, part: TransferPart) -> None:
        """Stream part of a delivery; proton sends it as TRANSFERs with more=true until the last."""
        sender = state.sender
        message = part.message
        if part.start == 0:
            sender.delivery(str(message.seq))
        sender.stream(message.read()[part.start : part.end])
        if part.end == message.size:
            delivery = sender.current
            assert delivery is not None
            sender.advance()
            part.link.transport_sent()
            if not part.link.ack_required:
                delivery.settle()
            else:
                # Its buffer goes back once proton has framed it (an unsettled delivery lives
                # until the client settles it: gateway/payload_buffers.py).
                state.session.connection.sent.append(c_object(delivery))

    def _send_link_flow(self, state: OutgoingLinkState | None, flow: LinkFlow) -> None:
        """Send a drain completion; proton can send no other FLOW for a sending link."""
        if state is None or not flow.drain:
            return
        state.drain_pending = flow
        self._complete_drain(state)

    def _complete_drain(self, state: OutgoingLinkState) -> None:
        """Let proton send the drained FLOW once it holds no transfer of the link.

        Proton drops the drained FLOW if told while transfers still wait inside it (for the
        window, say); it must come after them anyway (AMQP 1.0 §2.6.7). When the transfers
        used up all the credit, ``drained()`` sends nothing and ``send_drained_flow`` does.
        """
        sender = state.sender
        if sender.queued:
            return
        state.drain_pending = None
        state.link.transport_drained(sender.drained() or send_drained_flow(sender))
