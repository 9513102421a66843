"""Dynamic sources and targets (AMQP 1.0 §3.5.3, §3.5.4), as RabbitMQ 4.2 serves them.

A link whose source (a consumer's) or target (a publisher's) is dynamic asks the server to make
a node for it and name it in the ATTACH reply. RabbitMQ makes two kinds, by the capability the
terminus asks for:

- ``rabbitmq:volatile-queue`` (sources only, RabbitMQ 4.2): Direct Reply-To. The source must
  have durability none, expiry policy link-detach, timeout 0, and the link pre-settled
  transfers (RabbitMQ's conditions). The node is a reply queue (:mod:`queues.volatile`) at
  ``/queues/amq.rabbitmq.reply-to.<random>``, which the requester puts in its requests'
  ``reply-to``.
- ``temporary-queue`` (RabbitMQ 4.1): an exclusive classic queue of the link's connection,
  ``/queues/amq.dyn-<container-id>-<link name>-<random>``, deleted when the link detaches (or
  its connection closes): the reply queue of request-reply clients that want one to hold
  messages, or a queue to publish to.

Any other dynamic terminus is refused with ``amqp:not-implemented``, as RabbitMQ refuses it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Final
from urllib.parse import quote

from proton import UNDESCRIBED, Array, Data, Described, Link, Terminus, symbol

from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.volatile import VolatileQueue
from sluicegate.wire.addresses import AddressNotImplemented

VOLATILE_QUEUE: Final = symbol("rabbitmq:volatile-queue")
TEMPORARY_QUEUE: Final = symbol("temporary-queue")
# The node properties RabbitMQ answers a dynamic terminus with (AMQP 1.0 §3.5.9, §3.5.10).
_LIFETIME_POLICY: Final = symbol("lifetime-policy")
_DELETE_ON_CLOSE: Final = symbol("amqp:delete-on-close:list")
_SUPPORTED_DIST_MODES: Final = symbol("supported-dist-modes")
_MOVE: Final = symbol("move")
# RabbitMQ names a temporary queue after its container and link when they are this short, so
# that the name, sent with every message, stays small.
_NAMED_UP_TO: Final = 150
# Random bytes in a name: as many as a UUID, so that a name cannot be guessed.
_NAME_BYTES: Final = 18


def _symbols(*values: symbol) -> Array:
    """An AMQP array of symbols (proton's stubs type the undescribed marker wrongly)."""
    return Array(UNDESCRIBED, Data.SYMBOL, *values)  # type: ignore[arg-type]


def _capabilities(terminus: Terminus) -> list[object]:
    """A terminus's capabilities: one symbol or an array of them (§3.5.3)."""
    data = terminus.capabilities
    data.rewind()
    if data.next() is None:
        return []
    value = data.get_object()
    if isinstance(value, Array):
        return list(value.elements)
    return [value]


def _echo(terminus: Terminus, address: str, capability: symbol) -> None:
    """Answer a dynamic terminus with the node made for it (RabbitMQ's reply)."""
    terminus.address = address
    terminus.dynamic = True
    terminus.durability = Terminus.NONDURABLE
    terminus.expiry_policy = Terminus.EXPIRE_WITH_LINK
    terminus.timeout = 0
    terminus.distribution_mode = Terminus.DIST_MODE_MOVE
    capabilities: Data = terminus.capabilities
    capabilities.clear()
    capabilities.put_object(_symbols(capability))
    properties: Data = terminus.properties
    properties.clear()
    properties.put_object(
        {
            _LIFETIME_POLICY: Described(_DELETE_ON_CLOSE, []),
            _SUPPORTED_DIST_MODES: _symbols(_MOVE),
        }
    )


# Declares a temporary queue of this name for the link's connection, checking its permissions.
Declare = Callable[[str], QueueType]
# Raises unless the link's connection may consume from a reply queue of this name.
Authorise = Callable[[str], None]


def dynamic_source(
    link: Link, registry: QueueRegistry, declare: Declare, authorise: Authorise
) -> tuple[QueueType, str | None]:
    """The node a consumer's dynamic source asks for, and the name of a temporary queue made
    for it (to delete when the link detaches), or None for a reply queue.

    Everything that can refuse the link is checked before the node is made.
    """
    source = link.remote_source
    capabilities = _capabilities(source)
    if VOLATILE_QUEUE in capabilities:
        if (
            source.address
            or source.durability != Terminus.NONDURABLE
            or source.expiry_policy != Terminus.EXPIRE_WITH_LINK
            or source.timeout != 0
            or link.remote_snd_settle_mode != Link.SND_SETTLED
        ):
            raise AddressNotImplemented(
                "a Direct Reply-To source has no address, durability none, expiry policy "
                "link-detach, timeout 0, and takes replies pre-settled"
            )
        volatile = VolatileQueue()
        authorise(volatile.name)
        registry.add_volatile(volatile)
        _echo(link.source, f"/queues/{volatile.name}", VOLATILE_QUEUE)
        return volatile, None
    if TEMPORARY_QUEUE in capabilities:
        name = _temporary_name(link)
        queue = declare(name)
        _echo(link.source, f"/queues/{quote(name, safe='-._~')}", TEMPORARY_QUEUE)
        return queue, name
    raise AddressNotImplemented(
        "dynamic sources are served with the capability rabbitmq:volatile-queue (Direct "
        "Reply-To) or temporary-queue"
    )


def dynamic_target(link: Link, declare: Declare) -> str:
    """Make the temporary queue a publisher's dynamic target asks for; return its name."""
    if TEMPORARY_QUEUE not in _capabilities(link.remote_target):
        raise AddressNotImplemented(
            "dynamic targets are served with the capability temporary-queue"
        )
    name = _temporary_name(link)
    declare(name)
    _echo(link.target, f"/queues/{quote(name, safe='-._~')}", TEMPORARY_QUEUE)
    return name


def _temporary_name(link: Link) -> str:
    """A temporary queue's name, as RabbitMQ makes it."""
    container = link.connection.remote_container or ""
    token = secrets.token_urlsafe(_NAME_BYTES)
    if len(container) + len(link.name) < _NAMED_UP_TO:
        return f"amq.dyn-{container}-{link.name}-{token}"
    return f"amq.dyn.gen-{token}"
