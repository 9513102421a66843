"""Accepting client connections: one listening socket, a proton server transport per client.

Proton's ``Acceptor`` listens with a backlog of 10 and accepts one client per readiness, so a
burst of connects overflows and waits for SYN retransmits (docs/design.md). This one listens with a
large backlog and accepts up to :data:`ACCEPT_BATCH` clients per readiness.

At the descriptor limit (EMFILE, ENFILE) the listening socket stays readable, and polling it would
spin the reactor on failed accepts: the listener stops polling it for :data:`BACKOFF` seconds,
during which clients wait in the backlog, and tries again. A socket over
``max_unauthenticated_connections`` is closed as soon as it is accepted. Both are logged at most
once per interval (gateway/rare_warning.py), never once per client.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import ssl
from typing import Final

from proton import Event, Handler, Transport
from proton.reactor import Container

from sluicegate.gateway import reading
from sluicegate.gateway.broker import Broker
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.gate import Gate, peer_subject
from sluicegate.gateway.handover import Handovers
from sluicegate.gateway.limits import configure_transport
from sluicegate.gateway.login import PasswordChecks
from sluicegate.gateway.proton.internals import Selectable, register, serve
from sluicegate.gateway.proton.io_layer import listen_socket
from sluicegate.gateway.rare_warning import RareWarning
from sluicegate.gateway.rules.auth import anonymous_user
from sluicegate.gateway.sasl import SaslServer
from sluicegate.gateway.state import ConnectionState
from sluicegate.transport.channel import TlsChannel

log = logging.getLogger("sluicegate.listener")

# Linux caps this at net.core.somaxconn (4096 by default since 5.4).
LISTEN_BACKLOG: Final = 4096
# Clients accepted per readiness: a full backlog is taken in a few passes of the reactor, each
# short enough that connected clients are served in between.
ACCEPT_BATCH: Final = 128
# Seconds the listening socket is left alone once accept() fails for lack of descriptors: long
# enough that the failed attempts cost nothing, short enough that a freed descriptor is used soon.
BACKOFF: Final = 0.25
_NO_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Listener(Handler):
    """The server's listening socket as a reactor selectable."""

    def __init__(
        self,
        container: Container,
        config: ServerConfig,
        broker: Broker,
        logins: PasswordChecks,
        *,
        address: tuple[str, int] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__()
        self._container = container
        self._config = config
        self._broker = broker
        self._exhausted = RareWarning(f"cannot accept, retrying every {BACKOFF:g} s")
        self._refused = RareWarning("refusing clients over max_unauthenticated_connections")
        self._tls = tls
        self._logins = logins.queue(
            config.max_pending_logins, config.max_pending_logins_per_address
        )
        host, port = address or (config.host, config.port)
        self._anonymous = anonymous_allowed(config.anonymous_login, host)
        self._socket = listen_socket(host, port, LISTEN_BACKLOG, reuse_port=config.workers > 1)
        self.port: int = self._socket.getsockname()[1]
        self._selectable = register(container, self._socket, self)
        # Set on a worker that hands connections over (gateway/handover.py), plain ones only.
        self.handovers: Handovers | None = None

    def on_selectable_readable(self, event: Event) -> None:
        """Accept the waiting clients, up to :data:`ACCEPT_BATCH`."""
        handshakes = self._broker.handshakes
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._socket.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in _NO_DESCRIPTORS:
                    self._back_off(error)
                    return
                raise
            if handshakes.admit():
                self.serve(sock, str(peer[0]))
            else:
                sock.close()
                self._refused.happened(self._container.now, f"{handshakes.pending} pending")

    def _back_off(self, error: OSError) -> None:
        """Stop polling the listening socket for :data:`BACKOFF` seconds."""
        self._exhausted.happened(self._container.now, error.strerror or str(error))
        selectable = self._selectable
        if selectable.is_terminal:
            return
        selectable.reading = False
        selectable.update()
        self._container.schedule(BACKOFF, self)

    def on_timer_task(self, event: Event) -> None:
        """The back-off is over: poll the listening socket again."""
        selectable = self._selectable
        if not selectable.is_terminal:
            selectable.reading = True
            selectable.update()

    def serve(self, sock: socket.socket, address: str, *, recorded: bool = True) -> ConnectionState:
        """Serve a client's socket, accepted here or handed over by another worker
        (gateway/handover.py); ``recorded``: a plain one may be handed over at its first
        ATTACH."""
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        container = self._container
        connection = container.connection()
        transport = Transport(Transport.SERVER)
        configure_transport(transport, self._config)
        transport.bind(connection)
        selectable = Selectable(sock, container)
        serve(selectable, connection, transport)
        state = self._broker.accept(connection, transport, selectable, _connection_name(sock))
        connection.sg = state
        setattr(selectable, "sg", state)  # noqa: B010
        users = self._config.users
        tokens = self._config.oauth2 is not None
        channel = None if self._tls is None else TlsChannel(self._tls, server_side=True)
        sasl = SaslServer(
            anonymous_user(users, tokens=tokens) if self._anonymous else None,
            offer_plain=tokens or any(user.password is not None for user in users.values()),
            users=users,
            peer_subject=peer_subject(self._tls, channel),
        )
        state.deadlines.accepted(container.now, self._config.handshake_timeout)
        gate = Gate(state, sasl, self._logins, channel, address)
        setattr(selectable, "gate", gate)  # noqa: B010
        handovers = self.handovers
        if recorded and handovers is not None and self._tls is None:
            handovers.record(state)
        reading.update(transport, selectable, container.now)
        return state

    def close(self) -> None:
        """Stop accepting; connected clients are not affected."""
        if not self._selectable.is_terminal:
            self._selectable.terminate()
            self._selectable.update()


def _connection_name(sock: socket.socket) -> str:
    """RabbitMQ's name for a connection: its two ends, ``PEER:PORT -> LOCAL:PORT``."""
    try:
        peer, local = sock.getpeername(), sock.getsockname()
    except OSError:
        return f"socket {sock.fileno()}"  # reset already: the next read closes it
    return f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"


def anonymous_allowed(setting: str, host: str) -> bool:
    """Whether ANONYMOUS (or no SASL at all) is accepted on a listener bound to ``host``."""
    if setting != "loopback":
        return setting == "on"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
