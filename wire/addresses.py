"""What an AMQP address names: RabbitMQ 4's v2 form, a bare name, or a URL.

``/queues/NAME`` and ``/exchanges/NAME`` or ``/exchanges/NAME/KEY`` (each segment
percent-encoded: RabbitMQ 4's address v2), a bare ``NAME`` for simple clients, and the path of
a whole URL (``amqps://host/NAME``), which some clients send. Consumers read from queues only;
publishers send to a queue, to an exchange, or (a null target) to each message's ``to``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from sluicegate.wire.errors import AmqpError


class AddressError(AmqpError):
    """An address that names nothing this server can serve."""

    condition = "amqp:not-found"


class AddressNotImplemented(AmqpError):
    """An address form the server recognises but does not serve."""

    condition = "amqp:not-implemented"


@dataclass(frozen=True, slots=True)
class QueueAddress:
    """A queue, by name."""

    queue: str


@dataclass(frozen=True, slots=True)
class ExchangeAddress:
    """An exchange, with the routing key fixed by the address or (``None``) the subject's."""

    exchange: str
    routing_key: str | None


Address = QueueAddress | ExchangeAddress


def parse_address(address: str | None) -> QueueAddress:
    """Map a consumer's source address to the queue it names."""
    parsed = parse_target(address)
    if isinstance(parsed, ExchangeAddress):
        raise AddressError(f"consumers read from queues, not exchanges: {address!r}")
    return parsed


def parse_target(address: str | None) -> Address:
    """Map a link's address to the queue or exchange it names."""
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
    if address.startswith("/exchanges/"):
        segments = address[len("/exchanges/") :].split("/")
        if not segments[0] or len(segments) > 2:
            raise AddressError(f"bad exchange address {address!r}: expected /exchanges/NAME[/KEY]")
        exchange = unquote(segments[0])
        if exchange == "amq.default":
            raise AddressError("the default exchange is addressed as /queues/NAME")
        key = unquote(segments[1]) if len(segments) == 2 else None
        return ExchangeAddress(exchange, key)
    if address.startswith("/exchange/"):
        raise AddressNotImplemented(f"address v1 exchange form is not served: {address!r}")
    if address.startswith("/queue/"):
        return QueueAddress(unquote(address[len("/queue/") :]))
    name = address.lstrip("/")
    if not name:
        raise AddressError(f"address {address!r} names no queue")
    return QueueAddress(name)
