"""A small client of RabbitMQ 4's HTTP-over-AMQP management (``/management``), for scenario set-up.

The fan-out scenario declares its exchange, queues and bindings this way, so it runs unchanged
against sluicegate and RabbitMQ 4. One link pair named alike, requests with the method in
``subject`` and the path in ``to``, one reply per request with the status code in ``subject``.
Set-up only, so messages go through proton's ``Message`` and each request waits for its reply.
"""

from __future__ import annotations

import socket
import time
import uuid
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

from proton import Delivery, Endpoint, Link, Message, symbol

from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver.arrow import describe

__all__ = ["Management", "ManagementError"]

ADDRESS: Final[str] = "/management"
LINK_NAME: Final[str] = "bench-management"
REPLY_CREDIT: Final[int] = 8  # one reply per request: a few in hand is plenty
TIMEOUT_S: Final[float] = 30.0
POLL_S: Final[float] = 0.05


class ManagementError(RuntimeError):
    """The server has no management node, or refused a request; one line for the user."""


class Management:
    """A connection with the management link pair; a context manager that closes it."""

    def __init__(self, host: str, port: int, hostname: str | None = None) -> None:
        """Connect; ``hostname`` is OPEN's (``vhost:NAME`` chooses a virtual host)."""
        try:
            sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
            self.engine = Pump.client(sock, "bench management", hostname or host)
        except OSError as error:
            raise ManagementError(f"cannot connect to {host}:{port}: {error.strerror}") from None
        connection = self.engine.connection
        connection.open()
        session = connection.session()
        session.open()
        self.requests = session.sender(LINK_NAME)
        self.replies = session.receiver(LINK_NAME)
        for link in (self.requests, self.replies):
            link.source.address = ADDRESS
            link.target.address = ADDRESS
            link.snd_settle_mode = Link.SND_SETTLED
            link.properties = {symbol("paired"): True}
            link.open()
        self.replies.flow(REPLY_CREDIT)
        self.wait(self.attached, "attaching to /management")

    def __enter__(self) -> Management:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.engine.connection.close()
        self.engine.pump(POLL_S)
        self.engine.close()

    def attached(self) -> bool:
        """Both links are open at both ends (and the server kept the address)."""
        return all(link.state & Endpoint.REMOTE_ACTIVE for link in (self.requests, self.replies))

    def wait(self, done: Any, what: str) -> None:
        """Move bytes until ``done()``; ``ManagementError`` if the server refuses or is silent."""
        deadline = time.monotonic() + TIMEOUT_S
        while not done():
            for endpoint in (self.requests, self.replies, self.engine.connection):
                if endpoint.state & Endpoint.REMOTE_CLOSED:
                    reason = describe(endpoint.remote_condition, "closed by the server")
                    raise ManagementError(f"{what}: {reason}")
            if self.engine.closed or self.engine.eof:
                raise ManagementError(f"{what}: connection lost")
            if time.monotonic() > deadline:
                raise ManagementError(f"{what}: no answer within {TIMEOUT_S:g} s")
            self.engine.pump(POLL_S)

    def request(
        self, method: str, path: str, body: dict[str, object] | None = None
    ) -> tuple[int, object]:
        """Send one request and return the reply's status code and body; raise if refused."""
        status, reply = self.reply(method, path, body)
        if status >= 300:
            raise ManagementError(f"{method} {path}: {status} {reply!s}")
        return status, reply

    def reply(
        self, method: str, path: str, body: dict[str, object] | None = None
    ) -> tuple[int, object]:
        """Send one request and return the reply's status code and body, whatever the status."""
        what = f"{method} {path}"
        self.wait(lambda: self.requests.credit > 0, f"{what}: waiting for credit")
        message_id = str(uuid.uuid4())
        message = Message(id=message_id, address=path, subject=method, reply_to="$me", body=body)
        delivery = self.requests.delivery(message_id)
        self.requests.send(message.encode())
        self.requests.advance()
        delivery.settle()

        def replied() -> bool:
            current = self.replies.current
            return current is not None and current.readable and not current.partial

        self.wait(replied, what)
        current = self.replies.current
        assert current is not None
        encoded = self.replies.recv(current.pending)
        if encoded is None:
            raise ManagementError(f"{what}: an empty reply")
        reply = Message()
        reply.decode(encoded)
        self.replies.advance()
        current.update(Delivery.ACCEPTED)
        current.settle()
        self.replies.flow(1)
        if reply.correlation_id != message_id:
            raise ManagementError(f"{what}: the reply does not answer the request (no such node)")
        try:
            status = int(str(reply.subject))
        except ValueError:
            raise ManagementError(f"{what}: a reply without a status code") from None
        return status, reply.body

    def declare_queue(self, name: str) -> None:
        """PUT /queues/NAME: a classic queue, not durable."""
        body: dict[str, object] = {
            "durable": False,
            "exclusive": False,
            "auto_delete": False,
            "arguments": {},
        }
        self.request("PUT", f"/queues/{quote(name, safe='')}", body)

    def declare_exchange(self, name: str, kind: str) -> None:
        """PUT /exchanges/NAME of type ``kind`` (fanout, direct, topic)."""
        body: dict[str, object] = {
            "type": kind,
            "durable": False,
            "auto_delete": False,
            "internal": False,
            "arguments": {},
        }
        self.request("PUT", f"/exchanges/{quote(name, safe='')}", body)

    def bind(self, exchange: str, queue: str, key: str = "") -> None:
        """POST /bindings from ``exchange`` to ``queue`` with ``key``."""
        body: dict[str, object] = {
            "source": exchange,
            "destination_queue": queue,
            "binding_key": key,
            "arguments": {},
        }
        self.request("POST", "/bindings", body)
