"""Authorisation of attaches: RabbitMQ's configure / write / read permissions on queue names.

A publisher's link needs *write* on the queue it targets, a consumer's *read* on the queue it
reads; attaching to a queue that does not exist yet declares it, which also needs *configure*.
A refusal is an ``amqp:unauthorized-access`` DETACH after a null terminus (§2.6.3), the way
every other attach is refused; the connection and its other links carry on.
"""

from __future__ import annotations

from proton import Link

from gateway.addresses import parse_address
from gateway.auth import Access, User
from queues.errors import QueueError
from queues.registry import QueueRegistry


class AccessRefused(QueueError):
    """The user may not do this to this queue."""

    condition = "amqp:unauthorized-access"


def authorise_attach(user: User | None, link: Link, registry: QueueRegistry) -> None:
    """Raise :class:`AccessRefused` unless ``user`` may attach ``link``."""
    terminus = link.remote_source if link.is_sender else link.remote_target
    if terminus.dynamic or not terminus.address:
        return  # refused for what it is, by the attach itself
    try:
        name = parse_address(terminus.address).queue
    except QueueError:
        return  # likewise: the attach reports the bad address
    if user is None:
        raise AccessRefused("the connection has not logged in")
    access: Access = "read" if link.is_sender else "write"
    if not user.permissions.allows(access, name):
        raise AccessRefused(f"user {user.name!r} may not {access} queue {name!r}")
    if registry.get(name) is None and not user.permissions.allows("configure", name):
        raise AccessRefused(f"user {user.name!r} may not declare queue {name!r}")
