"""Who is connected where: virtual hosts, their queues and connections, users' connections and
sessions, and RabbitMQ's vhost and user limits checked at the door.

A connection enters one virtual host at OPEN (``hostname = vhost:NAME``): the virtual host must
exist and its user must have permissions there, or the connection is closed with
``amqp:not-allowed``; then the vhost's and the user's connection limits are checked, as RabbitMQ's
reader does, in that order. Every count here is a counter kept on the way in and out, so each
check is O(1) whatever the number of connections, sessions or queues.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sluicegate.gateway.rules.auth import DEFAULT_VHOST, Permissions, User
from sluicegate.gateway.rules.routing import (
    DEFAULT_MAX_APPLICATION_PROPERTIES_SIZE,
    DEFAULT_MAX_CC_KEYS,
    DEFAULT_MAX_MESSAGE_ANNOTATIONS_SIZE,
    Router,
)
from sluicegate.gateway.rules.vhosts import VhostSettings, requested_vhost
from sluicegate.queues.errors import NotFound, QueueError
from sluicegate.queues.registry import QueueRegistry


class NotAllowed(QueueError):
    """A connection that may not enter the virtual host its OPEN names."""

    condition = "amqp:not-allowed"


class QuotaExceeded(QueueError):
    """A vhost or user limit reached: the request is refused, nothing else is affected."""

    condition = "amqp:resource-limit-exceeded"


@dataclass(frozen=True, slots=True)
class BindingRequest:
    """A binding a request asks for: its ends, key and arguments."""

    source: str
    destination: str
    binding_key: str
    arguments: Mapping[str, object]
    to_exchange: bool


@dataclass(eq=False, slots=True)
class VirtualHost:
    """One virtual host: its namespace of queues, exchanges and bindings, and its limits."""

    settings: VhostSettings
    registry: QueueRegistry
    # Where its publishers' messages go.
    router: Router
    connections: int = 0

    @property
    def name(self) -> str:
        """The virtual host's name, as clients name it."""
        return self.settings.name

    def check_queue_room(self, queue: str) -> None:
        """Raise unless declaring ``queue`` stays within ``max_queues`` (RabbitMQ's wording).

        Declaring a queue that exists is a redeclaration and always within the limit.
        """
        limit = self.settings.max_queues
        registry = self.registry
        if limit is not None and registry.get(queue) is None and registry.queue_count >= limit:
            raise QuotaExceeded(
                f"cannot declare queue '{queue}': queue limit in vhost '{self.name}' "
                f"({limit}) is reached"
            )

    def check_exchange_room(self, exchange: str) -> None:
        """Raise unless declaring ``exchange`` stays within ``max_exchanges``."""
        limit = self.settings.max_exchanges
        registry = self.registry
        if limit is None or registry.exchange_count < limit:
            return
        try:
            registry.exchange(exchange)
        except NotFound:
            raise QuotaExceeded(
                f"cannot declare exchange '{exchange}': exchange limit in vhost '{self.name}' "
                f"({limit}) is reached"
            ) from None

    def check_binding_room(self, binding: BindingRequest) -> None:
        """Raise unless adding ``binding`` stays within ``max_bindings``."""
        limit = self.settings.max_bindings
        registry = self.registry
        if limit is None or registry.binding_count < limit:
            return
        kind = "exchange" if binding.to_exchange else "queue"
        if not registry.has_binding(
            binding.source, binding.destination, binding.binding_key, binding.arguments, kind
        ):
            raise QuotaExceeded(
                f"cannot bind '{binding.destination}' to '{binding.source}': binding limit in "
                f"vhost '{self.name}' ({limit}) is reached"
            )


@dataclass(slots=True)
class _Usage:
    """What one user holds across its connections."""

    connections: int = 0
    sessions: int = 0


@dataclass(frozen=True, slots=True)
class Admission:
    """Where an admitted connection is and what its user may do there."""

    vhost: VirtualHost
    permissions: Permissions


class Tenancy:
    """Every virtual host of a server and what each user holds."""

    def __init__(
        self,
        settings: Mapping[str, VhostSettings],
        registries: Mapping[str, QueueRegistry],
        max_application_properties_size: int = DEFAULT_MAX_APPLICATION_PROPERTIES_SIZE,
        max_message_annotations_size: int = DEFAULT_MAX_MESSAGE_ANNOTATIONS_SIZE,
        max_cc_keys: int = DEFAULT_MAX_CC_KEYS,
        *,
        attach_declares_queues: bool = True,
    ) -> None:
        self._router_limits = (
            max_application_properties_size,
            max_message_annotations_size,
            max_cc_keys,
        )
        self._declares = attach_declares_queues
        self.vhosts: dict[str, VirtualHost] = {}
        for vhost in settings.values():
            self.add(vhost, registries[vhost.name])
        self._usage: dict[str, _Usage] = {}

    def add(self, settings: VhostSettings, registry: QueueRegistry) -> VirtualHost:
        """A virtual host, configured or created at run time (gateway/runtime_vhosts.py)."""
        vhost = self.vhosts[settings.name] = VirtualHost(
            settings, registry, Router(registry, *self._router_limits, declares=self._declares)
        )
        return vhost

    def remove(self, name: str) -> None:
        """Forget a virtual host deleted at run time, once its connections are closed."""
        del self.vhosts[name]

    @property
    def default(self) -> VirtualHost:
        """The default virtual host, ``/``."""
        return self.vhosts[DEFAULT_VHOST]

    def check_entry(
        self, user: User | None, hostname: str | None
    ) -> tuple[VirtualHost, Permissions]:
        """The virtual host the OPEN's hostname names and the user's permissions in it; raise
        :class:`NotAllowed` for no user, an unknown virtual host or one without permissions."""
        if user is None:
            raise NotAllowed("the connection has not logged in")
        name = requested_vhost(hostname)
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise NotAllowed(f"virtual host '{name}' does not exist")
        permissions = user.permissions(name)
        if permissions is None:
            raise NotAllowed(f"access to vhost '{name}' refused for user '{user.name}'")
        return vhost, permissions

    def admit(self, user: User | None, hostname: str | None) -> Admission:
        """Let a logged-in connection into the virtual host its OPEN's hostname names.

        Raises :class:`NotAllowed` for a connection without a user (its first bytes were no
        AMQP or SASL header, so SASL never ran), an unknown virtual host or one without
        permissions, :class:`QuotaExceeded` over the vhost's or the user's connection limit.
        """
        vhost, permissions = self.check_entry(user, hostname)
        name = vhost.name
        assert user is not None
        limit = vhost.settings.max_connections
        if limit is not None and vhost.connections >= limit:
            raise QuotaExceeded(
                f"access to vhost '{name}' refused for user '{user.name}': "
                f"vhost connection limit ({limit}) is reached"
            )
        usage = self._usage.get(user.name) or _Usage()
        limit = user.limits.max_connections
        if limit is not None and usage.connections >= limit:
            raise QuotaExceeded(
                f"connection refused for user '{user.name}': user connection limit ({limit}) "
                "is reached"
            )
        usage.connections += 1
        self._usage[user.name] = usage
        vhost.connections += 1
        return Admission(vhost, permissions)

    def leave(self, user: User, vhost: VirtualHost) -> None:
        """An admitted connection closed; its sessions have been ended before."""
        vhost.connections -= 1
        usage = self._usage[user.name]
        usage.connections -= 1
        if not usage.connections:
            del self._usage[user.name]

    def begin_session(self, user: User) -> None:
        """Count a session of ``user``, or raise :class:`QuotaExceeded` over its limit."""
        usage = self._usage[user.name]
        limit = user.limits.max_sessions
        if limit is not None and usage.sessions >= limit:
            raise QuotaExceeded(
                f"session refused for user '{user.name}': user session limit ({limit}) is reached"
            )
        usage.sessions += 1

    def end_session(self, user: User) -> None:
        """A counted session of ``user`` ended."""
        self._usage[user.name].sessions -= 1
