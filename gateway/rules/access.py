"""Authorisation of attaches: RabbitMQ's configure / write / read permissions on queue names.

A publisher's link needs *write* on the queue or exchange it targets, a consumer's *read* on the
queue it reads; attaching to a queue that does not exist yet declares it, which also needs
*configure* and room under the virtual host's ``max_queues``. A null target (each message's
``to`` decides) needs *write* ``.*``. Permissions are those of the connection's user in the
virtual host its OPEN entered.
A refusal is an ``amqp:unauthorized-access`` DETACH after a null terminus (§2.6.3), the way
every other attach is refused; the connection and its other links carry on.
"""

from __future__ import annotations

from sluicegate.gateway.rules.auth import Access, Permissions, User
from sluicegate.gateway.rules.names import check_name
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.queues.errors import AccessRefused
from sluicegate.wire.addresses import ExchangeAddress, parse_address, parse_target
from sluicegate.wire.errors import AmqpError


def authorise_attach(
    user: User | None,
    permissions: Permissions | None,
    vhost: VirtualHost,
    address: str | None,
    *,
    consumer: bool,
    dynamic: bool,
) -> None:
    """Raise :class:`AccessRefused` unless ``user`` may attach a link in ``vhost`` whose
    terminus (the source of a ``consumer``'s link, the target of a publisher's) names
    ``address`` or is ``dynamic``."""
    if user is None or permissions is None:
        raise AccessRefused("the connection has not logged in")
    if dynamic:
        return  # refused for what it is, by the attach itself
    if not address:
        if not consumer and permissions.write.pattern != ".*":
            # A null target sends each message to its own ``to``: only a user who may write
            # everywhere gets one, so that no message needs a check of its own.
            raise AccessRefused(f"user {user.name!r} may not publish with a null target")
        return
    try:
        target = parse_address(address) if consumer else parse_target(address)
    except AmqpError:
        return  # refused by the attach itself, which names the bad address
    if isinstance(target, ExchangeAddress):
        _require(user, permissions, "write", "exchange", target.exchange)
        return
    _require(user, permissions, "read" if consumer else "write", "queue", target.queue)
    if vhost.registry.get(target.queue) is None:
        _require(user, permissions, "configure", "queue", target.queue)
        check_name("queue", target.queue)
        vhost.check_queue_room(target.queue)


def authorise_temporary(
    user: User | None,
    permissions: Permissions | None,
    vhost: VirtualHost,
    name: str,
    access: Access,
) -> None:
    """Raise unless ``user`` may have a temporary queue ``name`` made and ``access`` it (a
    dynamic terminus): *configure* on the name, as RabbitMQ checks, and room for a queue."""
    if user is None or permissions is None:
        raise AccessRefused("the connection has not logged in")
    _require(user, permissions, "configure", "queue", name)
    _require(user, permissions, access, "queue", name)
    vhost.check_queue_room(name)


def authorise_reply_to(user: User | None, permissions: Permissions | None, name: str) -> None:
    """Raise unless ``user`` may consume from the Direct Reply-To queue ``name``: *read* on the
    name, as on any queue a consumer reads (no *configure*: nothing is declared, and the queue
    takes no room under ``max_queues``)."""
    if user is None or permissions is None:
        raise AccessRefused("the connection has not logged in")
    _require(user, permissions, "read", "queue", name)


def _require(user: User, permissions: Permissions, access: Access, kind: str, name: str) -> None:
    if not permissions.allows(access, name):
        verb = "declare" if access == "configure" else access
        raise AccessRefused(f"user {user.name!r} may not {verb} {kind} {name!r}")
