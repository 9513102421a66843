"""Sessions: BEGIN and END, each proton session paired with a pure outbound session.

A session over its user's limit is refused with an END that says why. Ending a session, by an
END or with its connection, gives its consumers' messages back to their queues and lets go of
its links and the temporary queues they made; proton's session is freed once its records are
taken off (gateway/state.py).
"""

from __future__ import annotations

from proton import Session

from sluicegate.gateway.conditions import close
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.limits import EndpointsFull, endpoint_taken, session_ended
from sluicegate.gateway.links import Links
from sluicegate.gateway.management.node import ManagementNode
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.sending import Sending
from sluicegate.gateway.state import (
    RECORD,
    ConnectionState,
    IncomingLinkState,
    SessionState,
    forget_session,
)
from sluicegate.session.endpoint_memory import SESSION_COST
from sluicegate.session.outbound import IMPORT_CREDIT_FACTOR
from sluicegate.session.outbound import Session as PureSession
from sluicegate.wire.errors import AmqpError


class Sessions:
    """Every session of a server."""

    def __init__(
        self,
        config: ServerConfig,
        tenancy: Tenancy,
        management: ManagementNode,
        publishing: Publishing,
        links: Links,
        sending: Sending,
    ) -> None:
        self._config = config
        self._tenancy = tenancy
        self._management = management
        self._publishing = publishing
        self._links = links
        self._queue_links = links.queue_links
        self._sending = sending

    def begin(self, session: Session) -> None:
        """A BEGIN: pair the proton session with a pure outbound session.

        A session over its user's limit is refused: BEGIN answered, then END with the reason.
        One the server's account of endpoints has no room for raises :class:`EndpointsFull`,
        which closes the connection.
        """
        connection: ConnectionState = session.connection.sg
        if connection.vhost is None or connection.closed:
            return  # frames pipelined after an OPEN that was refused
        assert connection.user is not None
        try:
            self._tenancy.begin_session(connection.user)
        except AmqpError as error:
            session.open()
            close(session, error)
            return
        try:
            endpoint_taken(connection, SESSION_COST, "session")
        except EndpointsFull:
            self._tenancy.end_session(connection.user)
            raise
        # Parts of a message are cut at our own max-frame-size at most, whatever the client's.
        max_frame_size = self._config.max_frame_size
        remote = connection.transport.remote_max_frame_size
        pure = PureSession(
            connection.writer,
            max_queue_credit=self._config.max_queue_credit,
            max_import_credit=IMPORT_CREDIT_FACTOR * self._config.max_queue_credit,
            max_frame_size=min(remote, max_frame_size) if remote else max_frame_size,
            unsettled=self._sending.unsettled,
            waiting=connection.waiting,
        )
        state = SessionState(connection, session, pure)
        state.endpoint_bytes = SESSION_COST
        connection.sessions[pure.writer_credit] = state
        self._sending.begin(state)
        session.sg = state
        session.open()

    def ended(self, session: Session) -> None:
        """An END: its links are gone and their messages go back."""
        state: SessionState | None = getattr(session, "sg", None)
        if state is not None:
            held = self._sending.outbound_bytes()
            self.end(state)
            # Proton frees the session's links now, whoever ended it first.
            session_ended(state)
            self._sending.pooled(state.connection, held)
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

    def end(self, state: SessionState) -> None:
        """End a session once, whoever ends it: its consumers' messages go back to their
        queues, its publishers and temporary queues go."""
        if state.pure.writer_credit not in state.connection.sessions:
            return
        connection = state.connection
        del connection.sessions[state.pure.writer_credit]
        assert connection.user is not None
        assert connection.vhost is not None
        self._tenancy.end_session(connection.user)
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
            self._publishing.detach(publisher)
        registry = connection.vhost.registry
        for sender in state.senders:
            self._queue_links.discard(registry, sender.queue.name, sender)
        self._sending.route(state.pure.end())
        self._management.end_session(state)
        self._sending.forget(state)
        # Its links' records point back at it: emptied, they hold it no more (a cycle would
        # keep the connection's proton objects until a full collection, gateway/state.py).
        state.senders.clear()
        for queue in queues:
            registry.consumer_left(queue)
            self._management.consumer_left(
                registry, queue, self._queue_links.consumers(registry, queue.name)
            )
        # They go with their links, as at a DETACH (the publishers were detached above).
        for made in temporary:
            self._links.delete_temporary(connection, made)
        self._sending.resume(connection)
