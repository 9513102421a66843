"""Virtual hosts created and deleted at run time (RabbitMQ's ``PUT /api/vhosts/{name}``).

Configured virtual hosts (``[vhosts.NAME]`` tables) are fixed; these come and go through the
HTTP API and are kept in ``vhosts.json`` in the data directory, written atomically (a new file,
fsynced, renamed over the old) before a creation is acknowledged, so that a virtual host whose
queues the log holds exists again after a restart (gateway/durability.py refuses to start
otherwise). Everything here runs on the reactor thread.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from proton import Condition

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.rules.auth import DEFAULT_VHOST
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.gateway.rules.vhost_log import VhostLog
from sluicegate.gateway.rules.vhosts import VhostSettings
from sluicegate.queues.log.store import MessageStore
from sluicegate.queues.registry import QueueRegistry

FILE_NAME: Final = "vhosts.json"
# Each virtual host is a registry the broker visits on every flush: RabbitMQ's operators run
# tens of them; this many keeps that pass short whatever an API client creates.
MAX_RUNTIME_VHOSTS: Final = 100
# RabbitMQ's limit on a name's length, in bytes.
MAX_NAME_BYTES: Final = 255


class VhostRefused(Exception):
    """A creation or deletion that cannot be done; ``status`` is the HTTP answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class RuntimeVhostsDamaged(ValueError):
    """``vhosts.json`` cannot be read as a list of names: the server does not start."""


def load(data_dir: Path) -> dict[str, VhostSettings]:
    """The virtual hosts created at run time by an earlier run, to declare before recovery."""
    try:
        names = json.loads((data_dir / FILE_NAME).read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as error:
        raise RuntimeVhostsDamaged(f"{data_dir / FILE_NAME}: {error}") from None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise RuntimeVhostsDamaged(f"{data_dir / FILE_NAME}: expected a JSON list of names")
    return {name: VhostSettings(name) for name in names}


class RuntimeVhosts:
    """Creates and deletes virtual hosts of a running server."""

    def __init__(
        self, broker: Broker, store: MessageStore, data_dir: Path, created: set[str]
    ) -> None:
        self._broker = broker
        self._store = store
        self._file = data_dir / FILE_NAME
        # The names created at run time (this run or an earlier one): only these may go.
        self.created = created

    def create(self, name: str) -> bool:
        """Create ``name``; False if it exists already (RabbitMQ's 204)."""
        tenancy = self._broker.tenancy
        if name in tenancy.vhosts:
            return False
        if not name or "\x00" in name or len(name.encode()) > MAX_NAME_BYTES:
            raise VhostRefused(400, f"a virtual host name is 1 to {MAX_NAME_BYTES} bytes, no NUL")
        if len(self.created) >= MAX_RUNTIME_VHOSTS:
            raise VhostRefused(
                403, f"virtual host limit reached: {MAX_RUNTIME_VHOSTS} created at run time"
            )
        self._save(self.created | {name})
        self.created.add(name)
        default = tenancy.default.registry
        registry = QueueRegistry(default.clock, VhostLog(self._store, name), default.held)
        vhost = tenancy.add(VhostSettings(name), registry)
        broker = self._broker
        broker.management.routers[registry] = Router(
            registry, node=broker.node, vhost=name, quotas=vhost
        )
        broker.expiry.registries.append(registry)
        return True

    def delete(self, name: str) -> None:
        """Close its connections, delete its queues and exchanges, forget it."""
        broker = self._broker
        vhost = broker.tenancy.vhosts.get(name)
        if vhost is None:
            raise VhostRefused(404, "Not Found")
        if name not in self.created or name == DEFAULT_VHOST:
            raise VhostRefused(
                403, f"virtual host '{name}' is configured ([vhosts.{name}]): it stays"
            )
        self._close_connections(vhost)
        registry = vhost.registry
        for queue in registry.queue_names():
            registry.delete_queue(queue)
            broker.queue_deleted(registry, queue)
        for exchange in list(registry.exchanges()):
            if exchange.name and not exchange.name.startswith("amq."):
                registry.delete_exchange(exchange.name)
        broker.tenancy.remove(name)
        del broker.management.routers[registry]
        broker.expiry.registries.remove(registry)
        self.created.discard(name)
        self._save(self.created)

    def _close_connections(self, vhost: VirtualHost) -> None:
        broker = self._broker
        for state in [c for c in broker.connections if c.vhost is vhost]:
            broker.release_connection(state)
            state.connection.condition = Condition(
                "amqp:connection:forced", f"virtual host '{vhost.name}' is deleted"
            )
            state.connection.close()

    def _save(self, names: set[str]) -> None:
        """Write the names, atomically and durably, before the change is acknowledged."""
        temporary = self._file.with_suffix(".tmp")
        try:
            with temporary.open("w") as file:
                json.dump(sorted(names), file)
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(self._file)
        except OSError as error:
            raise VhostRefused(500, f"cannot write {self._file}: {error.strerror}") from None
