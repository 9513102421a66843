"""Links: ATTACH and DETACH, a consumer's credit, temporary queues and who may attach what.

An ATTACH echoes both termini, then serves the queue or exchange its address names, or a
temporary queue its dynamic terminus makes (gateway/dynamic.py), once the user may
(gateway/rules/access.py); a refused one gets the null terminus and DETACH of §2.6.3. A
consumer's link lives in its session's pure state machine; a publisher's in
gateway/publishing.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import cast

from proton import Array, Data, Endpoint, Link, Sender, Terminus, symbol

from sluicegate.gateway.conditions import close
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.consumers import consumer_options
from sluicegate.gateway.dynamic import Declare, dynamic_source, dynamic_target
from sluicegate.gateway.limits import (
    AttachDataExceeded,
    EndpointsFull,
    SessionLimitExceeded,
    link_attached,
    link_detached,
)
from sluicegate.gateway.login import LoginQueue, Ticket
from sluicegate.gateway.management.node import ManagementNode, management_caller
from sluicegate.gateway.proton.internals import reactor_now
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.queue_links import QueueLinks
from sluicegate.gateway.renewal import apply_renewal, token_to_verify
from sluicegate.gateway.rules.access import (
    authorise_attach,
    authorise_reply_to,
    authorise_temporary,
)
from sluicegate.gateway.rules.auth import Access, Permissions, User
from sluicegate.gateway.rules.management.requests import Response
from sluicegate.gateway.rules.outcomes import stated_outcomes
from sluicegate.gateway.rules.settle_modes import refuse_unhonoured
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.gateway.sending import Sending
from sluicegate.gateway.state import (
    ConnectionState,
    IncomingLinkState,
    OutgoingLinkState,
    SessionState,
    forget_endpoint,
)
from sluicegate.queues.errors import AccessRefused, ResourceDeleted, ResourceLocked
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.queue_type import ConsumerOptions, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.volatile import VolatileQueue
from sluicegate.session.channel.remote import RemoteQueue
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.wire.addresses import parse_address
from sluicegate.wire.errors import AmqpError


def _state_outcomes(link: Link) -> None:
    """The consumer's source in the reply lists the outcomes the server takes of those the
    client listed (gateway/rules/outcomes.py); raises if it listed one the server does not."""
    asked = link.remote_source.outcomes
    asked.rewind()
    listed: list[str] | None = None
    if asked.next() is not None:
        value = asked.get_object()
        elements = value.elements if isinstance(value, Array) else [value]
        listed = [str(element) for element in elements]
    stated = link.source.outcomes
    stated.clear()
    stated.put_array(False, Data.SYMBOL)
    stated.enter()
    for outcome in stated_outcomes(listed):
        stated.put_symbol(symbol(outcome))
    stated.exit()


def _authorise(
    user: User | None, permissions: Permissions | None, link: Link, vhost: VirtualHost
) -> None:
    """Raise unless ``user`` may attach ``link`` (gateway/rules/access.py decides)."""
    terminus = link.remote_source if link.is_sender else link.remote_target
    authorise_attach(
        user,
        permissions,
        vhost,
        terminus.address,
        consumer=link.is_sender,
        dynamic=terminus.dynamic,
    )


class Links:
    """Every link of a server: attach, detach, a consumer's credit, temporary queues."""

    def __init__(
        self,
        config: ServerConfig,
        management: ManagementNode,
        publishing: Publishing,
        queue_links: QueueLinks,
        sending: Sending,
        renewals: LoginQueue,
    ) -> None:
        self._config = config
        # Renewed tokens wait here for the login workers (gateway/renewal.py), one per
        # connection at most: the connection's check, until its verdict.
        self._renewals = renewals
        self._renewing: dict[ConnectionState, Ticket] = {}
        self._management = management
        self._publishing = publishing
        # Consumer and publisher links by their queue, for the queue's deletion.
        self.queue_links = queue_links
        self._sending = sending
        # What consumer filters decoded of messages, shared by every filter of the server.
        self.filter_views = ViewCache()
        # Keys for consumer links within their session; proton does not expose handles.
        self._handles = 0

    def attach(self, link: Link, session: SessionState) -> None:
        """An ATTACH: echo both termini, then serve the queue the address names or refuse.

        Raises what ends more than the link (the connection's or the session's limit on
        attach data and links, no room in the server's account of endpoints) for the broker
        to end that.
        """
        connection = session.connection
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        # The reply states the client's modes, a refusal too (as RabbitMQ's does), next to
        # its null terminus (gateway/rules/settle_modes.py).
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        try:
            link_attached(session, link, self._config)
            management = self._management.is_management(link)
            refuse_unhonoured(
                link.remote_snd_settle_mode,
                link.remote_rcv_settle_mode,
                server_sends=link.is_sender,
                management=management,
            )
            if management:
                assert connection.vhost is not None
                self._management.attach(
                    link, management_caller(connection), connection.vhost.registry
                )
                return
            vhost = connection.vhost
            assert vhost is not None
            _authorise(connection.user, connection.permissions, link, vhost)
            if link.is_sender:
                _state_outcomes(link)
                self._attach_consumer(link, vhost)
            elif link.remote_target.dynamic:
                name = dynamic_target(link, self._temporary(connection, vhost, "write"))
                try:
                    state = self._publishing.attach(link, name)
                except Exception:
                    self._delete_dynamic(vhost.registry, name)
                    raise
                connection.temporary[state] = (vhost.registry, name)
            else:
                self._publishing.attach(link)
        except (AttachDataExceeded, EndpointsFull, SessionLimitExceeded):
            raise
        except AmqpError as error:
            # The refusal of §2.6.3: a null terminus in the reply, then a DETACH with the error.
            terminus = link.source if link.is_sender else link.target
            terminus.type = Terminus.UNSPECIFIED
            link.open()
            close(link, error)

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
                budget = self._publishing.budget
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
        queue = registry.declare(address.queue, create=self._config.attach_declares_queues)
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
        if type(queue) is RemoteQueue:
            state.owner_pending = True
            return
        session.connection.fresh_links.append(state)
        link.open()

    def owner_took(self, link: OutgoingLink) -> None:
        """Another worker took a consumer of its queue: the client's ATTACH is answered."""
        state = self._sending.sender_of(link)
        if state is None or not state.owner_pending or state.link.detached:
            return
        state.owner_pending = False
        state.session.connection.fresh_links.append(state)
        state.sender.open()

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

    def release(self, connection: ConnectionState) -> None:
        """The connection ended: its links' temporary queues go, and no credit waits."""
        for link in list(connection.temporary):
            self.delete_temporary(connection, link)
        connection.fresh_links.clear()
        connection.credit_hold.clear()
        renewing = self._renewing.pop(connection, None)
        if renewing is not None:
            renewing.cancel()

    def delete_temporary(self, connection: ConnectionState, link: object) -> None:
        """A link that made a temporary queue is gone: so is the queue, as in RabbitMQ."""
        made = connection.temporary.pop(link, None)
        if made is not None:
            registry, name = made
            registry.delete_queue(name)
            self.queue_deleted(registry, name)

    def renew_credential(
        self,
        state: ConnectionState,
        method: str,
        body: object,
        done: Callable[[Response], None],
    ) -> Response | None:
        """``PUT /auth/tokens`` (gateway/renewal.py): the answer, or None while the token is
        verified on the login workers, ``done`` then getting it. A renewal that comes while
        the connection's previous one is verified, or while the workers have
        :data:`gateway.renewal.RENEWALS_WAITING` waiting, is refused with 503."""
        token = token_to_verify(state, method, body, self._config.oauth2)
        if isinstance(token, Response):
            return token
        if state in self._renewing:
            return Response(
                503,
                "a renewal of this connection is being verified: renew again once it is answered",
            )
        user, vhost = state.user, state.vhost
        assert user is not None  # token_to_verify saw to it
        assert vhost is not None
        ticket = self._renewals.submit(
            user.name, token, state.name, partial(self._verified, state, done), token_for=vhost.name
        )
        if ticket is None:
            return Response(503, "too many token renewals are being verified: try again")
        self._renewing[state] = ticket
        return None

    def _verified(
        self, state: ConnectionState, done: Callable[[Response], None], renewed: User | None
    ) -> None:
        """The login workers' verdict on a connection's renewed token, on the reactor."""
        ticket = self._renewing.pop(state, None)
        if ticket is None or state.closed:
            return
        done(self._renewed(state, renewed, ticket.refusal))

    def _renewed(self, state: ConnectionState, renewed: User | None, refusal: str) -> Response:
        """Apply a verified renewal. As RabbitMQ does, the links the renewed token no longer
        allows are detached with ``amqp:unauthorized-access``."""
        response = apply_renewal(
            state, renewed, refusal, wall_now=time.time(), now=reactor_now(state.selectable)
        )
        vhost = state.vhost
        if response.status != 204 or vhost is None:
            return response
        refused: list[tuple[Link, AccessRefused]] = []
        link = state.connection.link_head(Endpoint.LOCAL_ACTIVE)
        while link is not None:
            if isinstance(getattr(link, "sg", None), OutgoingLinkState | IncomingLinkState):
                try:
                    _authorise(state.user, state.permissions, link, vhost)
                except AmqpError as error:
                    # Whatever the rule that refuses it, the token no longer allows it.
                    refused.append((link, AccessRefused(str(error))))
            link = link.next(Endpoint.LOCAL_ACTIVE)
        for gone, refusal_of_link in refused:
            self.refuse(gone, refusal_of_link)
        return response

    def queue_deleted(self, registry: QueueRegistry, name: str) -> None:
        """Detach every link of a deleted queue with ``amqp:resource-deleted``, as RabbitMQ does.

        Consumers' unsettled messages go back to the deleted queue object and die with it.
        ``registry`` is its virtual host's: other virtual hosts may have queues of that name.
        """
        error = ResourceDeleted(f"queue '{name}' was deleted")
        for link in self.queue_links.take(registry, name):
            self.refuse(link, error)

    def refuse_consumer(self, link: OutgoingLink, error: AmqpError) -> None:
        """Detach a consumer link known by its pure link (another worker's queue ended it);
        one whose ATTACH the owner had not taken yet is refused as §2.6.3 says, a null
        source in the reply, as a local refusal is."""
        state = self._sending.sender_of(link)
        if state is None:
            return
        if state.owner_pending:
            state.owner_pending = False
            state.sender.source.type = Terminus.UNSPECIFIED
            state.sender.open()
        self.refuse(state.sender, error)

    def detached(self, link: Link) -> None:
        """A DETACH: release what the link held and answer it."""
        link_detached(link)
        held = self._sending.outbound_bytes()
        self._detach(link)
        link.close()
        session: SessionState | None = getattr(link.session, "sg", None)
        if session is not None:
            self._sending.pooled(session.connection, held)
        # Unless freed, proton keeps a detached link and every delivery it sent until its
        # session ends (80 MiB for 100,000 unsettled): freed as an ended session is.
        forget_endpoint(link)
        link.free()

    def refuse(self, link: Link, error: AmqpError) -> None:
        """Detach a link the server ends, saying why; the rest of the session carries on."""
        self._detach(link)
        close(link, error)

    def _detach(self, link: Link) -> None:
        state = getattr(link, "sg", None)
        if isinstance(state, OutgoingLinkState):
            state.session.senders.pop(state.link, None)
            self._sending.route(state.session.pure.detach_link(state.link))
            connection = state.session.connection
            vhost = connection.vhost
            assert vhost is not None
            registry, queue = vhost.registry, state.link.queue
            self.queue_links.discard(registry, queue.name, state.link)
            registry.consumer_left(queue)
            self._management.consumer_left(
                registry, queue, self.queue_links.consumers(registry, queue.name)
            )
            self.delete_temporary(connection, state.link)
            self._sending.resume(connection)
        elif isinstance(state, IncomingLinkState):
            self._publishing.detach(state)
            self.delete_temporary(state.connection, state)

    def flow(self, link: Link) -> None:
        """Maybe a client FLOW on a consumer link: the session tells (``transport_flow``).

        A FLOW for a link the server has detached (its queue was deleted, the client has not
        read the DETACH yet) is ignored: the DETACH answers it. Credit granted before the
        ATTACH reply was written waits (:meth:`attaches_written`).
        """
        state = getattr(link, "sg", None)
        if (
            not isinstance(state, OutgoingLinkState)
            or state.link.detached
            or not state.credit_counts
        ):
            return
        self._credit(link, state)

    def attaches_written(self, connection: ConnectionState, now: float) -> None:
        """The socket took the ATTACH replies of the connection's new consumer links at
        ``now``.

        Their credit counts from now on, so a link's first message never goes out in the same
        write as its ATTACH reply; credit the client granted before the reply waits for the
        client's next frame or ``attach_credit_hold`` (gateway/rules/credit_hold.py). Not a
        dynamic source's: its queue is new, empty and named to no one before the reply, and a
        Direct Reply-To queue would drop the replies that found the credit held.
        """
        fresh = connection.fresh_links
        connection.fresh_links = []
        hold = connection.credit_hold
        frames = connection.transport.frames_input
        for state in fresh:
            sender = state.sender
            if (
                sender.credit > 0
                and not sender.remote_source.dynamic
                and hold.hold(state, now, self._config.attach_credit_hold, frames)
            ):
                continue
            self._count(state)

    def credit_heard(self, connection: ConnectionState) -> None:
        """Bytes were read from the client: held credit counts if they completed a frame."""
        for state in connection.credit_hold.heard(connection.transport.frames_input):
            self._count(state)

    def credit_due(self, connection: ConnectionState, now: float) -> None:
        """Held credit whose ``attach_credit_hold`` has run out by ``now`` counts."""
        for state in connection.credit_hold.due(now):
            self._count(state)

    def _count(self, state: OutgoingLinkState) -> None:
        state.credit_counts = True
        if not state.link.detached and not state.session.connection.closed:
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
                self._sending.complete_drain(state)
        pure = state.session.pure
        if pure.transport_flow(state.link, link.credit, link.drain_mode, link.unsettled):
            self._sending.mark(state.session)
