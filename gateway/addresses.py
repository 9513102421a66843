"""Which queue an AMQP address names: RabbitMQ 4's v2 form, a bare name, or a URL.

``/queues/NAME`` (NAME percent-encoded, RabbitMQ 4's address v2), a bare ``NAME`` for simple
clients, and the path of a whole URL (``amqps://host/NAME``), which some clients send.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from queues.errors import QueueError


class AddressError(QueueError):
    """An address that names nothing this server can serve."""

    condition = "amqp:not-found"


class AddressNotImplemented(QueueError):
    """An address form the server recognises but does not serve."""

    condition = "amqp:not-implemented"


@dataclass(frozen=True, slots=True)
class QueueAddress:
    """A queue, by name."""

    queue: str


def parse_address(address: str | None) -> QueueAddress:
    """Map a link's source or target address to the queue it names."""
    if not address:
        raise AddressNotImplemented("a link needs an address: anonymous links are not served")
    if "://" in address:
        address = urlsplit(address).path
        if not address or address == "/":
            raise AddressError("the URL names no queue")
    if address.startswith("/queues/"):
        segment = address[len("/queues/") :]
        if not segment or "/" in segment:
            raise AddressError(f"bad queue address {address!r}: expected /queues/NAME")
        return QueueAddress(unquote(segment))
    if address.startswith(("/exchanges/", "/exchange/")):
        raise AddressNotImplemented(f"exchanges are not served yet: {address!r}")
    if address.startswith("/queue/"):
        return QueueAddress(unquote(address[len("/queue/") :]))
    name = address.lstrip("/")
    if not name:
        raise AddressError(f"address {address!r} names no queue")
    return QueueAddress(name)
