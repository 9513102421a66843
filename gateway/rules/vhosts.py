"""Virtual hosts as configured: RabbitMQ 4's separate namespaces, each with its own limits.

```toml
[vhosts."/"]            # the default virtual host always exists; this table only limits it
max_connections = 500

[vhosts.tenant-a]
max_queues = 100        # queues of any kind, exclusive ones included (RabbitMQ's max-queues)
max_connections = 20
max_exchanges = 50      # sluicegate's: exchanges clients declare (the amq.* ones not counted)
max_bindings = 1000     # sluicegate's: bindings of every kind
```

Each virtual host has its own queues, exchanges and bindings; a client chooses one with its
OPEN's ``hostname`` set to ``vhost:NAME`` (RabbitMQ 4's rule; any other hostname, or none,
means the default virtual host ``/``). A limit left out is no limit, ``0`` lets nothing in, and
``-1`` (RabbitMQ's way of saying none) is accepted too. RabbitMQ limits queues and connections;
exchanges and bindings cost memory as well, so sluicegate can limit them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sluicegate.gateway.rules.auth import DEFAULT_VHOST, UserError, parse_limit

# The hostname prefix by which a client names its virtual host (RabbitMQ 4).
VHOST_PREFIX: Final = "vhost:"
_LIMIT_KEYS: Final = ("max_queues", "max_connections", "max_exchanges", "max_bindings")


@dataclass(frozen=True, slots=True)
class VhostSettings:
    """One virtual host's name and RabbitMQ's vhost limits; None is no limit."""

    name: str
    max_queues: int | None = None
    max_connections: int | None = None
    max_exchanges: int | None = None
    max_bindings: int | None = None


def default_vhosts() -> dict[str, VhostSettings]:
    """What a server without ``[vhosts]`` tables has: the default virtual host, unlimited."""
    return {DEFAULT_VHOST: VhostSettings(DEFAULT_VHOST)}


def parse_vhosts(raw: object) -> dict[str, VhostSettings]:
    """Read the ``[vhosts.NAME]`` tables; the default virtual host is always among them."""
    if not isinstance(raw, Mapping):
        raise UserError("vhosts: expected a table of [vhosts.NAME] tables")
    vhosts = default_vhosts()
    for name, table in raw.items():
        key = f"vhosts.{name}"
        if not name:
            raise UserError("vhosts: a virtual host needs a name")
        if "\x00" in name:
            # The durable log qualifies names with the virtual host between NULs.
            raise UserError(f"vhosts.{name!r}: a virtual host name may not contain NUL")
        if not isinstance(table, Mapping):
            raise UserError(f"{key}: expected a table")
        unknown = set(table) - set(_LIMIT_KEYS)
        if unknown:
            raise UserError(f"{key}.{sorted(unknown)[0]}: unknown key")
        limits = (parse_limit(f"{key}.{limit}", table.get(limit, -1)) for limit in _LIMIT_KEYS)
        vhosts[str(name)] = VhostSettings(str(name), *limits)
    return vhosts


def requested_vhost(hostname: str | None) -> str:
    """The virtual host an OPEN's hostname names: ``vhost:NAME``, else the default one.

    The name is taken as sent, not percent-decoded, as RabbitMQ does.
    """
    if hostname and hostname.startswith(VHOST_PREFIX):
        return hostname[len(VHOST_PREFIX) :]
    return DEFAULT_VHOST
