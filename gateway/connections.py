"""Connections: OPEN and CLOSE, entry into a virtual host, and all a connection held given back.

A connection refused at its OPEN (a server or vhost limit, a virtual host it may not enter)
gets its OPEN and then a CLOSE saying why. However a connection ends (CLOSE, a lost socket, an
error), :meth:`Connections.release` ends its sessions, publishers, temporary queues and
management links once, and its records are taken off proton's endpoints once the transport
closes (gateway/state.py).
"""

from __future__ import annotations

import time
import weakref

from proton import Connection, Transport

from sluicegate.gateway.conditions import close, condition_of
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.disposition_bound import Copies, DispositionBound
from sluicegate.gateway.identity import open_properties
from sluicegate.gateway.limits import (
    Handshakes,
    check_connections,
    connection_ended,
    endpoint_taken,
)
from sluicegate.gateway.links import Links
from sluicegate.gateway.management.node import ManagementNode
from sluicegate.gateway.oauth2 import credential_lifetime
from sluicegate.gateway.proton.heap_trim import HeapTrimmer
from sluicegate.gateway.proton.internals import Selectable, reactor_now
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.rare_warning import CLIENT_BURST, RareWarning
from sluicegate.gateway.rules.tenancy import NotAllowed, Tenancy
from sluicegate.gateway.sending import Sending
from sluicegate.gateway.sessions import Sessions
from sluicegate.gateway.state import ConnectionState, forget
from sluicegate.session.account import Account
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.endpoint_memory import CONNECTION_COST, EndpointMemory
from sluicegate.session.waiting import Waiting
from sluicegate.wire.errors import AmqpError
from sluicegate.wire.link_names import LinkNames
from sluicegate.writer.writer import Writer

# A line per client refused at its OPEN, within the burst of its kind (gateway/rare_warning.py).
_refused_at_open = RareWarning("dropping a connection at its OPEN", burst=CLIENT_BURST)


class Connections:
    """Every connection of a server, from its accept to its last record."""

    def __init__(
        self,
        config: ServerConfig,
        tenancy: Tenancy,
        management: ManagementNode,
        publishing: Publishing,
        links: Links,
        sessions: Sessions,
        sending: Sending,
        trimmer: HeapTrimmer,
        dispositions: Copies,
    ) -> None:
        self._config = config
        self._tenancy = tenancy
        self._management = management
        self._publishing = publishing
        self._links = links
        self._sessions = sessions
        self._sending = sending
        self._trimmer = trimmer
        # What proton may copy of the DISPOSITIONs handed to it in a pass, over every connection.
        self._dispositions = dispositions
        self.open: set[ConnectionState] = set()
        # Connections that have not sent their OPEN yet, among ``open``.
        self.handshakes = Handshakes(config.max_unauthenticated_connections)
        # What every connection's endpoints hold, charged as each opens, begins and attaches.
        self.endpoints = EndpointMemory(config.endpoints_limit)
        self._open_properties = open_properties(config.rabbitmq_compatible)
        # Every connection's record, open or closed, until it is freed: what a closed
        # connection leaves behind shows here (tests/integration/test_connection_leaks.py).
        self.records: weakref.WeakSet[ConnectionState] = weakref.WeakSet()

    def accept(
        self, connection: Connection, transport: Transport, selectable: Selectable, name: str
    ) -> ConnectionState:
        """A client connected: its record, whose writer and sessions' waiting deliveries count
        toward the server's outbound bytes."""
        config = self._config
        writer = Writer(
            config.writer_initial_credit,
            config.writer_more_credit_after,
            config.writer_buffer_size,
            self._sending.pending_bytes,
        )
        waiting = Waiting(config.max_outgoing_pending_size, self._sending.waiting)
        waiting.writer = writer
        state = ConnectionState(
            connection,
            transport,
            selectable,
            name,
            writer,
            Account(config.account_limit),
            waiting,
            DeadLetterDebt(config.account_limit),
            DispositionBound(self._dispositions, self.release),
            LinkNames(config.max_frame_size) if config.rabbitmq_compatible else None,
            self.endpoints,
        )
        self.open.add(state)
        self.records.add(state)
        return state

    def opened(self, connection: Connection) -> None:
        """Answer OPEN with our identity and let the connection into its virtual host.

        Proton negotiates frame size and channels. A connection refused here (a server or
        vhost limit, no room in the account of endpoints, a virtual host it may not enter) gets
        its OPEN and then a CLOSE saying why, and nothing more is read from it: the socket is
        closed once the CLOSE is written, whether or not the client answers (waiting for its
        answer, a refused client sending heartbeats kept its connection, counted nowhere).
        One refused its virtual host with ``rabbitmq_compatible`` on is dropped without OPEN
        or CLOSE, the reason logged, as RabbitMQ's reader drops it (its OPEN handling fails
        the handshake, ``rabbit_amqp_reader``). RabbitMQ's Python client
        takes a CLOSE for a lost connection and reconnects from its handler without end; a
        connection dropped before OPEN makes it raise.
        """
        state: ConnectionState = connection.sg
        self.handshakes.finished(state)
        transport = state.transport
        if self._config.rabbitmq_compatible:
            try:
                self._tenancy.check_entry(state.user, connection.remote_hostname)
            except NotAllowed as error:
                _refused_at_open.happened(reactor_now(state.selectable), str(error))
                self.release(state)
                transport.close_tail()
                transport.close_head()
                return
        connection.properties = self._open_properties
        connection.open()
        # Proton announces the idle timeout in the OPEN it encodes now; from then on
        # gateway/rules/timeouts.py enforces it, counting whole frames only.
        transport.pending()
        transport.idle_timeout = 0.0
        config = self._config
        state.deadlines.opened(
            reactor_now(state.selectable),
            config.idle_timeout,
            transport.frames_input,
            config.send_timeout,
        )
        try:
            check_connections(len(self.open) - self.handshakes.pending, self._config)
            endpoint_taken(state, CONNECTION_COST, "connection")
            admission = self._tenancy.admit(state.user, connection.remote_hostname)
        except AmqpError as error:
            if state.arrival is None:
                self.close_for_error(state, error)
            else:
                # Offered by another worker, which keeps it when this one's output differs
                # from its own (gateway/handover.py).
                close(connection, error)
            return
        state.entered(admission.vhost, admission.permissions)
        state.opened_at = time.monotonic()
        user = state.user
        if user is not None and user.expires_at is not None:
            now = reactor_now(state.selectable)
            state.deadlines.credential(now, credential_lifetime(user.expires_at, time.time()))

    def closed_by_client(self, connection: Connection) -> None:
        """The client closed: give back what it held and answer CLOSE."""
        state: ConnectionState | None = getattr(connection, "sg", None)
        if state is not None:
            self.release(state)
        connection.close()

    def transport_closed(self, transport: Transport) -> None:
        """The socket is gone, with or without CLOSE: nothing of it may stay acquired, and
        nothing of it may stay in proton's records (gateway/state.py)."""
        state: ConnectionState | None = getattr(transport.connection, "sg", None)
        if state is not None:
            self.release(state)
            forget(state)

    def release(self, state: ConnectionState) -> None:
        """End every session of a connection once, returning its messages to their queues."""
        if state.closed:
            return
        state.closed = True
        # Its recording's notice refers to it (gateway/handover.py).
        state.recording = None
        held = self._sending.outbound_bytes()
        self.open.discard(state)
        self.handshakes.finished(state)
        for session in list(state.sessions.values()):
            self._sessions.end(session)
        self._publishing.release(state)
        self._links.release(state)
        self._management.release(state)
        if state.vhost is not None:
            assert state.user is not None
            self._tenancy.leave(state.user, state.vhost)
        state.writer.close()
        self._sending.released(state)
        endpoints = connection_ended(state)
        # What it held (its unsettled deliveries in proton above all, and proton's pool of
        # those its ended sessions held; its endpoints and their ATTACH data) is freed with its
        # record.
        released = max(held - self._sending.outbound_bytes(), state.pooled) + endpoints
        if released > 0:
            weakref.finalize(state, self._trimmer.freed, released).atexit = False

    def close_for_error(self, state: ConnectionState, error: AmqpError) -> None:
        """Close a connection that broke a limit: what it held goes back first.

        Nothing more is read from it: proton would otherwise go on filling the buffers of the
        deliveries it had begun (it gives them up only after writing their dispositions, which
        it no longer does once its CLOSE is out), for as long as the client keeps sending.
        """
        self.release(state)
        state.connection.condition = condition_of(error)
        state.connection.close()
        transport = state.transport
        transport.pending()  # the CLOSE is framed with its condition before the input ends
        transport.close_tail()
