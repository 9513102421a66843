"""Limits that hold under abuse: connections, sessions, links per session, frames, idleness.

Frame size, channel-max and idle-time-out are proton's to enforce once set on the transport
(it announces them in OPEN and closes a connection that breaks them); the connection count and
links per session are counted here, because proton does not.
"""

from __future__ import annotations

from proton import Endpoint, Link, Transport

from sluicegate.gateway.config import ServerConfig
from sluicegate.queues.errors import QueueError


class LimitExceeded(QueueError):
    """A client asked for more than the server's limit allows."""

    condition = "amqp:resource-limit-exceeded"


def configure_transport(transport: Transport, config: ServerConfig) -> None:
    """Apply the per-connection limits proton enforces itself."""
    transport.max_frame_size = config.max_frame_size
    transport.channel_max = config.channel_max
    transport.idle_timeout = config.idle_timeout


def check_connections(open_connections: int, config: ServerConfig) -> None:
    """Raise if one more connection than ``max_connections`` is opening."""
    if config.max_connections and open_connections > config.max_connections:
        raise LimitExceeded(f"connection limit {config.max_connections} reached")


def check_links(link: Link, config: ServerConfig) -> None:
    """Raise if ``link`` would exceed ``max_links_per_session`` on its session.

    Proton keeps no per-session count, so the connection's attached links are walked: an
    attach is rare next to transfers, and a connection holds few links.
    """
    session = link.session
    attached = 0
    other = link.connection.link_head(Endpoint.REMOTE_ACTIVE)
    while other is not None:
        if other.session == session:
            attached += 1
        other = other.next(Endpoint.REMOTE_ACTIVE)
    if attached > config.max_links_per_session:
        raise LimitExceeded(f"session link limit {config.max_links_per_session} reached")
