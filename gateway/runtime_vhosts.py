"""Virtual hosts created and deleted at run time (RabbitMQ's ``PUT /api/vhosts/{name}``).

Configured virtual hosts (``[vhosts.NAME]`` tables) are fixed; these come and go through the
HTTP API and are kept in ``vhosts.json`` in the data directory, written atomically (a new file,
fsynced, renamed over the old) before a creation is acknowledged, so that a virtual host whose
queues the log holds exists again after a restart (gateway/durability.py refuses to start
otherwise). The user who creates one gets every permission in it, as in RabbitMQ
(gateway/creator_grants.py); the file keeps who, as ``{"name": NAME, "granted": [USER]}``
entries (a bare name, as older files have it, granted nothing). With several workers, worker 0,
which serves the API, sends each creation and deletion to the others, which make their copies
(:meth:`RuntimeVhosts.adopt`, :meth:`RuntimeVhosts.drop`) and keep them in their own file
(docs/workers.md). Everything here runs on the reactor thread.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Final

from sluicegate.gateway import creator_grants
from sluicegate.gateway.broker import Broker
from sluicegate.gateway.conditions import condition
from sluicegate.gateway.rules.auth import DEFAULT_VHOST, User
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.gateway.rules.vhost_log import VhostLog
from sluicegate.gateway.rules.vhosts import VhostSettings
from sluicegate.queues.log.store import MessageStore
from sluicegate.queues.registry import QueueRegistry

log = logging.getLogger("sluicegate.vhosts")

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


def _entries(data_dir: Path) -> dict[str, list[str]]:
    """Each virtual host created at run time, with the users granted everything in it."""
    try:
        entries = json.loads((data_dir / FILE_NAME).read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as error:
        raise RuntimeVhostsDamaged(f"{data_dir / FILE_NAME}: {error}") from None
    if not isinstance(entries, list):
        raise RuntimeVhostsDamaged(f"{data_dir / FILE_NAME}: expected a JSON list")
    read: dict[str, list[str]] = {}
    for entry in entries:
        if isinstance(entry, str):
            read[entry] = []
        elif (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("granted"), list)
            and all(isinstance(user, str) for user in entry["granted"])
        ):
            read[entry["name"]] = entry["granted"]
        else:
            raise RuntimeVhostsDamaged(
                f"{data_dir / FILE_NAME}: an entry is a name or "
                f'{{"name": NAME, "granted": [USER]}}, not {entry!r}'
            )
    return read


def load(data_dir: Path) -> dict[str, VhostSettings]:
    """The virtual hosts created at run time by an earlier run, to declare before recovery."""
    return {name: VhostSettings(name) for name in _entries(data_dir)}


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
        # The server's users table, which grants change (gateway/creator_grants.py).
        self._users: dict[str, User] = broker.config.users
        # Who was granted everything in each of them, granted again now.
        self.granted = {
            name: users for name, users in _entries(data_dir).items() if name in created
        }
        for vhost, users in self.granted.items():
            for user in users:
                creator_grants.grant(self._users, user, vhost)

    def create(self, name: str, creator: str | None = None) -> bool:
        """Create ``name``, ``creator`` getting every permission in it if it is one of the
        server's users; False if it exists already (RabbitMQ's 204, nothing granted)."""
        tenancy = self._broker.tenancy
        if name in tenancy.vhosts:
            return False
        if not name or "\x00" in name or len(name.encode()) > MAX_NAME_BYTES:
            raise VhostRefused(400, f"a virtual host name is 1 to {MAX_NAME_BYTES} bytes, no NUL")
        if len(self.created) >= MAX_RUNTIME_VHOSTS:
            raise VhostRefused(
                403, f"virtual host limit reached: {MAX_RUNTIME_VHOSTS} created at run time"
            )
        granted = [creator] if creator is not None and creator in self._users else []
        self._make(name, granted)
        peers = self._broker.peers
        if peers is not None:
            peers.vhost_created(name, granted)
        return True

    def _make(self, name: str, granted: list[str]) -> None:
        tenancy = self._broker.tenancy
        self._save(self.created | {name}, {**self.granted, name: granted})
        self.created.add(name)
        self.granted[name] = granted
        for user in granted:
            creator_grants.grant(self._users, user, name)
        default = tenancy.default.registry
        registry = QueueRegistry(default.clock, VhostLog(self._store, name), default.held)
        vhost = tenancy.add(VhostSettings(name), registry)
        broker = self._broker
        broker.management.routers[registry] = Router(
            registry, node=broker.node, vhost=name, quotas=vhost
        )
        broker.expiry.registries.append(registry)
        if broker.peers is not None:
            broker.peers.place(name, registry)

    # -- copies of the virtual hosts another worker made (gateway/peers.py) ---------------

    def listing(self) -> dict[str, list[str]]:
        """Each virtual host created at run time and who was granted everything in it."""
        return {name: list(self.granted.get(name, [])) for name in sorted(self.created)}

    def adopt(self, name: str, granted: list[str]) -> None:
        """The worker that serves the HTTP API made ``name``: so does this one, with the
        same grants (kept in this worker's own file, for its log's sake at its next start)."""
        try:
            if name not in self._broker.tenancy.vhosts:
                # Worker 0 refuses past the limit; a copy keeps to it whatever it is sent.
                if len(self.created) >= MAX_RUNTIME_VHOSTS:
                    raise VhostRefused(403, f"{MAX_RUNTIME_VHOSTS} created at run time already")
                self._make(name, granted)
            elif name in self.created and self.granted.get(name) != granted:
                self._save(self.created, {**self.granted, name: granted})
                creator_grants.revoke(self._users, self.granted[name], name)
                self.granted[name] = granted
                for user in granted:
                    creator_grants.grant(self._users, user, name)
        except VhostRefused as error:
            log.warning("virtual host '%s' made on another worker: %s", name, error)

    def drop(self, name: str) -> None:
        """The worker that serves the HTTP API deleted ``name``: so does this one."""
        if name not in self.created:
            return
        try:
            self._forget(name)
        except VhostRefused as error:
            log.warning("virtual host '%s' deleted on another worker: %s", name, error)

    def delete(self, name: str) -> None:
        """Close its connections, delete its queues and exchanges, forget it; every other
        worker does the same."""
        broker = self._broker
        if name not in broker.tenancy.vhosts:
            raise VhostRefused(404, "Not Found")
        if name not in self.created or name == DEFAULT_VHOST:
            raise VhostRefused(
                403, f"virtual host '{name}' is configured ([vhosts.{name}]): it stays"
            )
        self._forget(name)
        if broker.peers is not None:
            broker.peers.vhost_deleted(name)

    def _forget(self, name: str) -> None:
        broker = self._broker
        vhost = broker.tenancy.vhosts[name]
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
        creator_grants.revoke(self._users, self.granted.pop(name, ()), name)
        self._save(self.created, self.granted)

    def _close_connections(self, vhost: VirtualHost) -> None:
        broker = self._broker
        for state in [c for c in broker.connections if c.vhost is vhost]:
            broker.release_connection(state)
            state.connection.condition = condition(
                "amqp:connection:forced", f"virtual host '{vhost.name}' is deleted"
            )
            state.connection.close()

    def _save(self, names: set[str], granted: dict[str, list[str]]) -> None:
        """Write the names and grants, atomically and durably, before the change is
        acknowledged."""
        entries = [{"name": name, "granted": granted.get(name, [])} for name in sorted(names)]
        temporary = self._file.with_suffix(".tmp")
        try:
            with temporary.open("w") as file:
                json.dump(entries, file)
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(self._file)
        except OSError as error:
            raise VhostRefused(500, f"cannot write {self._file}: {error.strerror}") from None
