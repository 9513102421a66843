"""Where ``sluicegate quiver`` connects: host, port and AMQP address parsed from its URL.

The rule: ``[amqp:]//HOST[:PORT]/PATH``. The port defaults to 5672. The AMQP address is PATH
without its leading slash (``amqp://h/q1`` → ``q1``), except for the broker address formats that
are themselves paths (RabbitMQ 4's ``/queues/NAME``, ``/exchanges/NAME[/KEY]``, and RabbitMQ 3's
``/queue/NAME``, ``/exchange/NAME``, ``/topic/NAME``, ``/amq/queue/NAME``), which are kept whole,
slash included. The path is used verbatim: percent-escapes are part of those formats, so they
are not decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

__all__ = ["DEFAULT_PORT", "Endpoint", "UrlError", "parse_url"]

DEFAULT_PORT: Final[int] = 5672  # IANA's port for AMQP without TLS
# Address formats whose leading slash belongs to the address (RabbitMQ 4 v2 and RabbitMQ 3 v1).
PATH_ADDRESS_PREFIXES: Final[tuple[str, ...]] = (
    "/queues/",
    "/exchanges/",
    "/queue/",
    "/exchange/",
    "/topic/",
    "/amq/queue/",
)


class UrlError(ValueError):
    """The URL does not name a host and an address the quiver can use."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A host and port to reach and the AMQP address to send to and receive from."""

    host: str
    port: int
    address: str

    @property
    def host_port(self) -> str:
        """``host:port`` as proton's ``connect`` and ``listen`` want it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_url(url: str) -> Endpoint:
    """Split a quiver URL by the rule in the module docstring; ``UrlError`` if it breaks it."""
    parts = urlsplit(url)
    if parts.scheme not in ("", "amqp"):
        raise UrlError(f"unsupported scheme {parts.scheme!r} in {url!r} (use amqp:// or //)")
    if not parts.netloc:
        raise UrlError(f"no host in {url!r} (expected amqp://HOST[:PORT]/ADDRESS)")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UrlError(f"{url!r} has parts the quiver does not use (user, query or fragment)")
    try:
        port = parts.port
    except ValueError:
        raise UrlError(f"bad port in {url!r}") from None
    host = parts.hostname
    if not host:
        raise UrlError(f"no host in {url!r}")
    if port == 0:
        raise UrlError(f"port 0 in {url!r}: the quiver needs a port to connect to")
    path = parts.path
    address = path if path.startswith(PATH_ADDRESS_PREFIXES) else path[1:]
    if not address or address in PATH_ADDRESS_PREFIXES:
        raise UrlError(f"no address in {url!r} (expected amqp://HOST[:PORT]/ADDRESS)")
    return Endpoint(host=host, port=DEFAULT_PORT if port is None else port, address=address)
