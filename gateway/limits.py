"""Limits that hold under abuse: connections, sessions, links per session, ATTACH data per
connection, what every connection's endpoints hold together, frames, idleness.

Frame size, channel-max and idle-time-out are proton's to enforce once set on the transport
(it announces them in OPEN and closes a connection that breaks them); the connection count and
links per session are counted here, because proton does not. Each check is O(1): a counter kept
as endpoints come and go, never a walk over them, so a client that attaches thousands of links
in one burst costs the reactor the same per ATTACH as one that attaches a few.
"""

from __future__ import annotations

from proton import Link, Transport

from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.proton.internals import remote_properties_size
from sluicegate.gateway.state import ConnectionState, SessionState
from sluicegate.queues.errors import QueueError
from sluicegate.session.endpoint_memory import LINK_COST


class LimitExceeded(QueueError):
    """A client asked for more than the server's limit allows."""

    condition = "amqp:resource-limit-exceeded"


def configure_transport(transport: Transport, config: ServerConfig) -> None:
    """Apply the per-connection limits proton enforces itself.

    The idle timeout is set too, for proton to announce it in OPEN; gateway/rules/timeouts.py
    enforces it.
    """
    transport.max_frame_size = config.max_frame_size
    transport.channel_max = config.channel_max
    transport.idle_timeout = config.idle_timeout


def check_connections(open_connections: int, config: ServerConfig) -> None:
    """Raise if one more connection than ``max_connections`` is opening."""
    if config.max_connections and open_connections > config.max_connections:
        raise LimitExceeded(f"connection limit {config.max_connections} reached")


class Handshakes:
    """Connections that have not sent their OPEN yet: counted apart, with their own cap.

    Such a socket holds a descriptor and a little memory until ``handshake_timeout`` drops it.
    Were it counted in ``max_connections``, a few sockets that never log in would lock every
    real client out; here they only fill ``max_unauthenticated_connections``, and a client
    that completes its handshake leaves that count for the other.
    """

    __slots__ = ("limit", "pending")

    def __init__(self, limit: int) -> None:
        # 0: no limit.
        self.limit = limit
        self.pending = 0

    def admit(self) -> bool:
        """Count a new socket, or say no when the cap is reached."""
        if self.limit and self.pending >= self.limit:
            return False
        self.pending += 1
        return True

    def finished(self, state: ConnectionState) -> None:
        """The client sent its OPEN, or the connection ended before it did (counted once)."""
        if state.deadlines.handshake_over():
            self.pending -= 1


class SessionLimitExceeded(LimitExceeded):
    """A client kept attaching links after refusals it never answered: its session ends."""


class AttachDataExceeded(LimitExceeded):
    """A client kept attaching links past refusals for their data: its connection is closed."""


class EndpointsFull(LimitExceeded):
    """No room in the server's account of endpoints (session/endpoint_memory.py) for one more
    session or link of a connection: the connection is closed, so that nothing refused stays
    held (proton keeps a refused link until the client detaches it)."""


def endpoint_taken(connection: ConnectionState, size: int, what: str) -> None:
    """Charge ``size`` bytes of a new ``what`` to the server's account of endpoints, or raise
    :class:`EndpointsFull` with nothing charged."""
    endpoints = connection.endpoints
    refusal = endpoints.refusal(connection.endpoint_bytes, size)
    if refusal is not None:
        raise EndpointsFull(f"no room for this {what}: {refusal}")
    connection.endpoint_bytes = endpoints.change(connection.endpoint_bytes, size)


def endpoint_given_back(connection: ConnectionState, size: int) -> None:
    """Give back ``size`` bytes of a connection's endpoints; a closed connection gave back
    everything already (:func:`connection_ended`)."""
    if not connection.closed:
        connection.endpoint_bytes = connection.endpoints.change(connection.endpoint_bytes, -size)


def connection_ended(connection: ConnectionState) -> int:
    """Everything the connection held in the account of endpoints goes back at once, however
    it ended: its sessions and links go with it. Returns what it held."""
    held = connection.endpoint_bytes
    connection.endpoint_bytes = connection.endpoints.change(held, -held)
    return held


def attach_size(link: Link) -> int:
    """Bytes of ATTACH data the server holds for ``link``: its name and properties, and its
    source and target (address, filter, capabilities, outcomes, node properties) twice.

    Proton keeps the client's termini and the server's echo is a copy of them; RSS per link
    follows this within a tenth, plus the fixed cost of a link (docs/operations.md). Proton's
    encoder sizes the data in C without copying it, so this costs little per ATTACH.
    """
    size = len(link.name.encode()) + remote_properties_size(link)
    for node in (link.remote_source, link.remote_target):
        address = node.address
        termini = len(address.encode()) if address else 0
        for data in (node.filter, node.capabilities, node.outcomes, node.properties):
            termini += max(data.encoded_size(), 0)
        size += 2 * termini
    return size


def link_attached(session: SessionState, link: Link, config: ServerConfig) -> None:
    """Count a client's ATTACH on ``session`` and charge its data to the connection, and the
    link with its data to the server's account of endpoints; raise if the link is one too
    many, its data would pass ``max_attach_data_size`` or the account has no room for it
    (:class:`EndpointsFull`, nothing counted).

    A refused link stays counted and charged until the client answers our DETACH with its own
    (proton holds it until then), so that unanswered refusals cannot pile up: past twice the
    link limit the session itself is ended (:class:`SessionLimitExceeded`).
    """
    size = attach_size(link)
    connection = session.connection
    endpoint_taken(connection, LINK_COST + size, "link")
    session.endpoint_bytes += LINK_COST + size
    session.links += 1
    session.attach_bytes += size
    connection.attach_bytes += size
    limit = config.max_links_per_session
    if session.links > 2 * limit:
        raise SessionLimitExceeded(
            f"session link limit {limit} reached and {session.links - limit} refused links "
            "not detached"
        )
    if session.links > limit:
        raise LimitExceeded(f"session link limit {limit} reached")
    data_limit = config.max_attach_data_size
    if connection.attach_bytes > 2 * data_limit:
        raise AttachDataExceeded(
            f"ATTACH data of the connection's links over twice max_attach_data_size "
            f"{data_limit} bytes, refused links not detached"
        )
    if connection.attach_bytes > data_limit:
        raise LimitExceeded(
            f"ATTACH data of the connection's links over max_attach_data_size "
            f"{data_limit} bytes (this link's: {size})"
        )


def link_detached(link: Link) -> None:
    """Count a client's DETACH of a link it attached, and give its data's charge back."""
    session: SessionState | None = getattr(link.session, "sg", None)
    if session is not None and session.live:
        session.links -= 1
        size = attach_size(link)
        session.attach_bytes -= size
        session.endpoint_bytes -= LINK_COST + size
        session.connection.attach_bytes -= size
        endpoint_given_back(session.connection, LINK_COST + size)


def session_ended(session: SessionState) -> None:
    """The client's END: the session's links went with it, and so does the charge of their
    ATTACH data. Not at the server's own END: proton holds the links until the client's."""
    session.connection.attach_bytes -= session.attach_bytes
    session.attach_bytes = 0
    endpoint_given_back(session.connection, session.endpoint_bytes)
    session.endpoint_bytes = 0
