"""Accepting client connections: one listening socket, a proton server transport per client.

Proton's ``Acceptor`` listens with a backlog of 10 and accepts one client per readiness, so a
burst of connects overflows and waits for SYN retransmits (DESIGN §1). This one listens with a
large backlog and accepts until the socket would block.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Final

from proton import Event, Transport
from proton._selectable import Selectable
from proton.reactor import Container

from sluicegate.gateway import reading
from sluicegate.gateway.auth import anonymous_user
from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.gate import Gate
from sluicegate.gateway.io_layer import listen_socket, register
from sluicegate.gateway.limits import configure_transport
from sluicegate.gateway.login import PasswordChecks
from sluicegate.gateway.sasl import SaslServer
from sluicegate.gateway.state import ConnectionState
from sluicegate.session.account import Account
from sluicegate.wire.link_names import LinkNames
from sluicegate.writer.writer import Writer

log = logging.getLogger("sluicegate.listener")

# Linux caps this at net.core.somaxconn (4096 by default since 5.4).
LISTEN_BACKLOG: Final = 4096


class Listener:
    """The server's listening socket as a reactor selectable."""

    def __init__(
        self,
        container: Container,
        config: ServerConfig,
        on_connection: Callable[[ConnectionState], None],
        logins: PasswordChecks,
        *,
        address: tuple[str, int] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._container = container
        self._config = config
        self._on_connection = on_connection
        self._tls = tls
        self._logins = logins
        host, port = address or (config.host, config.port)
        self._anonymous = anonymous_allowed(config.anonymous_login, host)
        self._socket = listen_socket(host, port, LISTEN_BACKLOG)
        self.port: int = self._socket.getsockname()[1]
        self._selectable = register(container, self._socket, self)

    def on_selectable_readable(self, event: Event) -> None:
        """Accept every waiting client."""
        while True:
            try:
                sock, _ = self._socket.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept: %s", error.strerror)
                    return
                raise
            self._serve(sock)

    def _serve(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        container = self._container
        connection = container.connection()
        # Marks an accepted connection: proton's IO handler would otherwise dial out for it.
        setattr(connection, "_acceptor", self)  # noqa: B010
        transport = Transport(Transport.SERVER)
        configure_transport(transport, self._config)
        transport.bind(connection)
        selectable = Selectable(sock, container)
        setattr(selectable, "_transport", transport)  # noqa: B010
        transport._selectable = selectable
        state = ConnectionState(
            connection,
            transport,
            selectable,
            Writer(self._config.writer_initial_credit, self._config.writer_more_credit_after),
            Account(self._config.account_limit),
            LinkNames(self._config.max_frame_size) if self._config.rabbitmq_compatible else None,
        )
        connection.sg = state
        setattr(selectable, "sg", state)  # noqa: B010
        users = self._config.users
        sasl = SaslServer(
            anonymous_user(users) if self._anonymous else None,
            offer_plain=any(user.password is not None for user in users.values()),
        )
        deadline = container.now + self._config.handshake_timeout
        gate = Gate(state, sasl, self._logins.check, self._tls, deadline)
        setattr(selectable, "gate", gate)  # noqa: B010
        self._on_connection(state)
        reading.update(transport, selectable, container.now)

    def close(self) -> None:
        """Stop accepting; connected clients are not affected."""
        if not self._selectable.is_terminal:
            self._selectable.terminate()
            self._selectable.update()


def anonymous_allowed(setting: str, host: str) -> bool:
    """Whether ANONYMOUS (or no SASL at all) is accepted on a listener bound to ``host``."""
    if setting != "loopback":
        return setting == "on"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
