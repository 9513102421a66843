"""A blocking client of the ``/management`` node, for the command line.

It speaks exactly what RabbitMQ's AMQP 1.0 clients speak (docs/management.md), so the CLI works
against sluicegate and against RabbitMQ 4 alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Self
from urllib.parse import quote

from proton import Message, SSLDomain
from proton.utils import BlockingConnection

# RabbitMQ 4 serves its management API at this address; so does sluicegate.
ADDRESS = "/management"
# A request and its reply normally take milliseconds; this bounds a stuck server.
REQUEST_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply's status code and decoded body."""

    status: int
    body: object

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300


def path_segment(name: str) -> str:
    """Percent-encode one path segment as RabbitMQ's clients do (``/`` included)."""
    return quote(name, safe="-._~")


def request_message(method: str, path: str, body: object = None) -> Message:
    """A request as RabbitMQ's clients send it: the method as subject, the path as ``to``."""
    message = Message(
        id=str(uuid.uuid4()), subject=method, address=path, reply_to="$me", durable=False
    )
    message.body = body  # type: ignore[assignment]
    return message


def reply_of(message: Message) -> Reply:
    """A reply's HTTP-like status (its subject) and body."""
    return Reply(int(str(message.subject)), message.body)


class ManagementClient:
    """One connection with one management link pair."""

    def __init__(
        self, url: str, timeout: float = REQUEST_TIMEOUT, vhost: str | None = None
    ) -> None:
        """Connect to ``url``, into virtual host ``vhost`` (the server's default if None)."""
        ssl = SSLDomain(SSLDomain.MODE_CLIENT) if url.startswith("amqps://") else None
        # RabbitMQ 4's rule: OPEN's hostname "vhost:NAME" chooses the virtual host.
        hostname = None if vhost is None else f"vhost:{vhost}"
        self._connection = BlockingConnection(
            url, timeout=timeout, ssl_domain=ssl, virtual_host=hostname
        )
        name = f"sluicegate-cli-{uuid.uuid4()}"
        self._requests = self._connection.create_sender(ADDRESS, name=name)
        self._replies = self._connection.create_receiver(ADDRESS, name=name, credit=1)
        self._timeout = timeout

    def request(self, method: str, path: str, body: object = None) -> Reply:
        """Send one request and wait for its reply."""
        self._requests.send(request_message(method, path, body), timeout=self._timeout)
        # Like RabbitMQ's clients: one credit per reply, granted by receive() when none is left.
        return reply_of(self._replies.receive(timeout=self._timeout))

    def close(self) -> None:
        """Close the link pair and the connection."""
        self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
