"""Limits that hold under abuse: connections, sessions, links per session, frames, idleness.

Frame size, channel-max and idle-time-out are proton's to enforce once set on the transport
(it announces them in OPEN and closes a connection that breaks them); the connection count and
links per session are counted here, because proton does not. Each check is O(1): a counter kept
as endpoints come and go, never a walk over them, so a client that attaches thousands of links
in one burst costs the reactor the same per ATTACH as one that attaches a few.
"""

from __future__ import annotations

from proton import Link, Transport

from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.state import ConnectionState, SessionState
from sluicegate.queues.errors import QueueError


class LimitExceeded(QueueError):
    """A client asked for more than the server's limit allows."""

    condition = "amqp:resource-limit-exceeded"


def configure_transport(transport: Transport, config: ServerConfig) -> None:
    """Apply the per-connection limits proton enforces itself.

    The idle timeout is set too, for proton to announce it in OPEN; gateway/timeouts.py
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
        if state.handshake_deadline:
            state.handshake_deadline = 0.0
            self.pending -= 1


class SessionLimitExceeded(LimitExceeded):
    """A client kept attaching links after refusals it never answered: its session ends."""


def link_attached(session: SessionState, config: ServerConfig) -> None:
    """Count a client's ATTACH on ``session``; raise if the link is one too many.

    A refused link stays counted until the client answers our DETACH with its own, so that
    unanswered refusals cannot pile up in proton: past twice the limit the session itself
    is ended (:class:`SessionLimitExceeded`).
    """
    session.links += 1
    limit = config.max_links_per_session
    if session.links > 2 * limit:
        raise SessionLimitExceeded(
            f"session link limit {limit} reached and {session.links - limit} refused links "
            "not detached"
        )
    if session.links > limit:
        raise LimitExceeded(f"session link limit {limit} reached")


def link_detached(link: Link) -> None:
    """Count a client's DETACH of a link it attached."""
    session: SessionState | None = getattr(link.session, "sg", None)
    if session is not None:
        session.links -= 1
