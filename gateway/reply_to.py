"""Direct Reply-To over AMQP 1.0, as RabbitMQ 4.2 serves it: a dynamic source.

A requester attaches a receiving link whose source is dynamic, has no address and asks for the
capability ``rabbitmq:volatile-queue``, with durability none, expiry policy link-detach,
timeout 0, and pre-settled transfers (RabbitMQ's conditions, ``rabbit_amqp_session``). The
server makes a reply queue (:mod:`queues.volatile`) and answers with its address,
``/queues/amq.rabbitmq.reply-to.<random>``, which the requester puts in its requests'
``reply-to``. Any other dynamic source is refused with ``amqp:not-implemented``, as RabbitMQ
refuses what it does not serve.
"""

from __future__ import annotations

from typing import Final

from proton import UNDESCRIBED, Array, Data, Described, Link, Terminus, symbol

from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.volatile import VolatileQueue
from sluicegate.wire.addresses import AddressNotImplemented

VOLATILE_QUEUE: Final = symbol("rabbitmq:volatile-queue")
# The node properties RabbitMQ answers a dynamic source with (AMQP 1.0 §3.5.9, §3.5.10).
_LIFETIME_POLICY: Final = symbol("lifetime-policy")
_DELETE_ON_CLOSE: Final = symbol("amqp:delete-on-close:list")
_SUPPORTED_DIST_MODES: Final = symbol("supported-dist-modes")
_MOVE: Final = symbol("move")


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


def attach_reply_to(link: Link, registry: QueueRegistry) -> VolatileQueue:
    """Make the reply queue a requester's dynamic source asks for and answer with its address."""
    source = link.remote_source
    if VOLATILE_QUEUE not in _capabilities(source):
        raise AddressNotImplemented(
            "dynamic sources are served for Direct Reply-To only (capability "
            "rabbitmq:volatile-queue)"
        )
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
    queue = registry.add_volatile()
    echoed = link.source
    echoed.address = f"/queues/{queue.name}"
    echoed.dynamic = True
    echoed.distribution_mode = Terminus.DIST_MODE_MOVE
    capabilities: Data = echoed.capabilities
    capabilities.clear()
    capabilities.put_object(_symbols(VOLATILE_QUEUE))
    properties: Data = echoed.properties
    properties.clear()
    properties.put_object(
        {
            _LIFETIME_POLICY: Described(_DELETE_ON_CLOSE, []),
            _SUPPORTED_DIST_MODES: _symbols(_MOVE),
        }
    )
    return queue
