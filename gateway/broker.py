"""Proton's endpoint and delivery events, handed to the object that owns their AMQP level.

The broker is the server's reactor handler and its composition root: it makes, each with its
collaborators, the objects of each level, and each ``on_*`` hands its event to one of them:

- connections (gateway/connections.py): OPEN, CLOSE, a lost socket, entry into a virtual host;
- sessions (gateway/sessions.py): BEGIN and END;
- links (gateway/links.py): ATTACH with authorisation and temporary queues, DETACH, credit;
- deliveries: a publisher's transfers (gateway/publishing.py), consumers' settlements
  (gateway/settling.py), and what goes out to consumers (gateway/sending.py), pumped together
  when the reactor runs out of events (:meth:`Broker.flush`).

What ends more than its own level (an attach over the connection's or the session's limits)
comes back here as an error and is ended by the level above.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from proton import Event, Handler

from sluicegate.gateway.conditions import close
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.connections import Connections
from sluicegate.gateway.dead_letters import route_dead_letters
from sluicegate.gateway.disposition_bound import Copies
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.events import (
    connection_of,
    delivery_of,
    link_of,
    session_of,
    transport_of,
)
from sluicegate.gateway.expiry import ExpiryTimer
from sluicegate.gateway.limits import AttachDataExceeded, EndpointsFull, SessionLimitExceeded
from sluicegate.gateway.links import Links
from sluicegate.gateway.login import PasswordChecks
from sluicegate.gateway.management.node import ManagementNode
from sluicegate.gateway.peers import Peers
from sluicegate.gateway.proton.heap_trim import HeapTrimmer
from sluicegate.gateway.proton.internals import c_object
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.queue_links import QueueLinks
from sluicegate.gateway.renewal import RENEWALS_WAITING
from sluicegate.gateway.rules.management.requests import Response
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.rules.modified_outcomes import ModifiedAnnotations
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.sending import Sending
from sluicegate.gateway.sessions import Sessions
from sluicegate.gateway.settling import Settling
from sluicegate.gateway.state import ConnectionState, SessionState
from sluicegate.gateway.supervisor import node_name
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.errors import AmqpError
from sluicegate.writer.writer import BLOCKED_MAX_BYTES

if TYPE_CHECKING:
    from sluicegate.gateway.handover import Handovers


class Broker(Handler):
    """The server's reactor handler: every connection's endpoints and deliveries."""

    def __init__(
        self,
        config: ServerConfig,
        tenancy: Tenancy,
        durability: Durability | None = None,
        peers: Peers | None = None,
        *,
        logins: PasswordChecks,
    ) -> None:
        super().__init__()
        self.config = config
        self.tenancy = tenancy
        # The default virtual host's registry; every registry shares its count of held bytes.
        registry = self.registry = tenancy.default.registry
        # Named as RabbitMQ names its nodes: clients show and compare queue leaders by it, and
        # the HTTP API reports it. A worker's names it, so a queue's leader says where it lives.
        node = self.node = f"{node_name(config)}@{socket.gethostname()}"
        budget = MemoryBudget(config.memory_budget)
        sending = self.sending = Sending(_nothing_held if peers is None else peers.held)
        # The management node reaches the links through the broker: it is made first, as the
        # links attach its link pairs.
        self.management = ManagementNode(
            {
                vhost.registry: Router(vhost.registry, node=node, vhost=vhost.name, quotas=vhost)
                for vhost in tenancy.vhosts.values()
            },
            self.queue_deleted,
            budget,
            self._renew_credential,
        )
        self.publishing = Publishing(
            config,
            registry,
            budget,
            sending.route,
            QueueLinks(),
            self.close_for_error,
            sending,
            durability,
        )
        self.links = Links(
            config,
            self.management,
            self.publishing,
            self.publishing.queue_links,
            sending,
            logins.queue(RENEWALS_WAITING, 1),
        )
        self.sessions = Sessions(
            config, tenancy, self.management, self.publishing, self.links, sending
        )
        # Gives the heap's freed pages back after large releases (gateway/proton/heap_trim.py).
        self.trimmer = HeapTrimmer()
        # What proton may copy of the DISPOSITIONs it is handed in a pass (gateway/feeding.py).
        self.disposition_copies = Copies(self._budget_room)
        self._connections = Connections(
            config,
            tenancy,
            self.management,
            self.publishing,
            self.links,
            self.sessions,
            sending,
            self.trimmer,
            self.disposition_copies,
        )
        self.modified_annotations = ModifiedAnnotations(
            config.max_message_annotations_size, budget, registry.held
        )
        settling = self.settling = Settling(
            self.publishing, self.links, sending, self.management, self.modified_annotations
        )
        self.expiry = ExpiryTimer(
            [vhost.registry for vhost in tenancy.vhosts.values()],
            sending.route,
            self.queue_deleted,
        )
        # What the reactor (gateway/proton/reactor.py), the listeners, the HTTP API and the tests
        # reach directly, bound once.
        self.connections = self._connections.open
        self.handshakes = self._connections.handshakes
        self.records = self._connections.records
        self.endpoints = self._connections.endpoints
        self.accept = self._connections.accept
        self.release_connection = self._connections.release
        self.queue_links = self.publishing.queue_links
        self.filter_views = self.links.filter_views
        self.attaches_written = self.links.attaches_written
        self.credit_heard = self.links.credit_heard
        self.credit_due = self.links.credit_due
        self.on_delivery_of = settling.on_delivery_of
        self.apply_settlements = settling.apply_settlements
        self.settlements = settling.settlements
        self.mark = sending.mark
        self.outbound_bytes = sending.outbound_bytes
        self.pending_bytes = sending.pending_bytes
        self.waiting = sending.waiting
        # The other workers of a server of several (gateway/peers.py).
        self.peers = peers
        # A worker's hand-overs of connections to other workers (gateway/handover.py).
        self.handovers: Handovers | None = None
        self.management.workers = peers

    def close_for_error(self, state: ConnectionState, error: AmqpError) -> None:
        """Close a connection that broke a limit (gateway/connections.py)."""
        self._connections.close_for_error(state, error)

    def queue_deleted(self, registry: QueueRegistry, name: str) -> None:
        """Detach every link of a deleted queue (gateway/links.py)."""
        self.links.queue_deleted(registry, name)

    def remote_consumer_left(self, registry: QueueRegistry, queue: QueueType) -> None:
        """A consumer on another worker of a queue here left (gateway/peers.py): as a local
        consumer's DETACH, its x-expires countdown restarts and an auto-delete queue may go."""
        registry.consumer_left(queue)
        self.management.consumer_left(
            registry, queue, self.queue_links.consumers(registry, queue.name)
        )

    def _renew_credential(
        self, state: ConnectionState, method: str, body: object, done: Callable[[Response], None]
    ) -> Response | None:
        """``PUT /auth/tokens`` on the management node (gateway/links.py)."""
        return self.links.renew_credential(state, method, body, done)

    # -- connections ----------------------------------------------------------------------

    def on_connection_remote_open(self, event: Event) -> None:
        self._connections.opened(connection_of(event))

    def on_connection_remote_close(self, event: Event) -> None:
        self._connections.closed_by_client(connection_of(event))

    def on_transport_closed(self, event: Event) -> None:
        self._connections.transport_closed(transport_of(event))

    # -- sessions -------------------------------------------------------------------------

    def on_session_remote_open(self, event: Event) -> None:
        """A BEGIN; one the account of endpoints has no room for closes the connection."""
        session = session_of(event)
        try:
            self.sessions.begin(session)
        except EndpointsFull as error:
            self.close_for_error(session.connection.sg, error)

    def on_session_remote_close(self, event: Event) -> None:
        self.sessions.ended(session_of(event))

    # -- links ----------------------------------------------------------------------------

    def on_link_remote_open(self, event: Event) -> None:
        """An ATTACH; one over the connection's limit on attach data, or that the account of
        endpoints has no room for, closes the connection; one over the session's limit on
        links ends the session."""
        link = link_of(event)
        session: SessionState | None = getattr(link.session, "sg", None)
        if session is None:
            return  # frames pipelined after a refused OPEN or BEGIN
        connection = session.connection
        if connection.closed:
            return  # frames read in the same pass as the CLOSE or the error that ended it
        try:
            self.links.attach(link, session)
        except (AttachDataExceeded, EndpointsFull) as error:
            self.close_for_error(connection, error)
        except SessionLimitExceeded as error:
            self.sessions.end(session)
            close(link.session, error)

    def on_link_remote_close(self, event: Event) -> None:
        self.links.detached(link_of(event))

    on_link_remote_detach = on_link_remote_close

    def on_link_flow(self, event: Event) -> None:
        self.links.flow(link_of(event))

    # -- deliveries -----------------------------------------------------------------------

    def on_delivery(self, event: Event) -> None:
        """A transfer from a publisher, or a consumer's settlement (through proton's dispatch,
        which has no other events to apply a run of settlements before)."""
        self.on_delivery_of(c_object(delivery_of(event)))
        self.apply_settlements()

    def _budget_room(self) -> int:
        """What the memory budget has left now (gateway/disposition_bound.py)."""
        budget = self.publishing.budget
        used = self.registry.held.total + self.sending.outbound_bytes() + budget.unfinished
        return budget.limit - used

    def flush(self) -> None:
        """Route dead letters, renew publisher credit, pump every session that has something
        new to send, and give the heap back after a large release."""
        # The pass's events are handled: proton's copies of its DISPOSITIONs' outcomes are gone.
        self.disposition_copies.forget()
        sending = self.sending
        budget = self.publishing.budget
        held = self.registry.held
        if route_dead_letters(
            self.tenancy.vhosts.values(),
            budget,
            held,
            sending.outbound_bytes,
            sending.route,
            sending.hold,
        ):
            self.expiry.soon()
        # Every virtual host's registry shares one count of bytes held (gateway/server.py).
        total = held.total
        # What the margin's classes hold, each weighed against its own part
        # (session/memory_budget.py).
        waiting = sending.waiting
        budget.imported = waiting.reserved + waiting.imported
        if self.peers is not None:
            budget.letters_sent, budget.letters_window_peak, budget.parked_sent = (
                self.peers.letters_sent()
            )
        self.publishing.flush()
        self.modified_annotations.forget()
        # The imports' part is taken: what requests out for another worker's deliveries bring
        # then lands within it (session/memory_budget.py, session/waiting.py).
        full = budget.blocked and budget.room_for(budget.imported, budget.imports_part) <= 0
        sending.budget_blocked(budget.blocked, full, budget.import_room(waiting.reserved))
        # Blocked, consumers that do not read stop at a small writer (writer/writer.py).
        sending.pending_bytes.cap = BLOCKED_MAX_BYTES if budget.blocked else 0
        sending.pump_marked()
        if self.peers is not None:
            # After the pump: the credit requests it made go out in this pass.
            self.peers.flush(budget)
        if self.handovers is not None:
            self.handovers.poll()
        self.trimmer.flush(total, time.monotonic())


def _nothing_held() -> int:
    """A single server holds nothing for other workers."""
    return 0
