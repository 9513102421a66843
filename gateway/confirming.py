"""The publish path's last step: a stored (or refused) copy confirmed to its publisher.

Both ways a copy is stored end here: an in-memory queue's enqueue (gateway/publishing.py) and
the log's fsync that covers a persistent one (gateway/durability.py). The pure inbound session
decides (session/inbound.py); this module applies its answer: reads resume, and the last copy
settles the delivery with its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias, cast

from proton import Delivery

from sluicegate.gateway import reading
from sluicegate.gateway.conditions import condition_of
from sluicegate.gateway.proton import deliveries
from sluicegate.gateway.state import ConnectionState
from sluicegate.queues.queue_type import Outcome
from sluicegate.session.inbound import RESUME, SETTLE, Unconfirmed
from sluicegate.wire.errors import AmqpError

DISPOSITIONS: Final[dict[Outcome, int]] = {
    Outcome.ACCEPTED: int(Delivery.ACCEPTED),
    Outcome.RELEASED: int(Delivery.RELEASED),
    Outcome.REJECTED: int(Delivery.REJECTED),
    Outcome.MODIFIED: int(Delivery.MODIFIED),
}


class ChannelConfirms(Protocol):
    """Who tells another worker its publishes are stored (gateway/peers.py)."""

    def confirmed(self, pending: ChannelPublish, outcome: Outcome, error: AmqpError | None) -> None:
        """``pending`` is stored (or refused): frame its Confirm."""


@dataclass(frozen=True, slots=True)
class ChannelPublish:
    """A publish another worker sent over the channel (docs/workers.md): confirmed to it, by
    ``peer`` and ``publish`` id, once stored, as a publisher's delivery is to its client."""

    peer: int
    publish: int
    confirms: ChannelConfirms


# Who waits for a message to be stored: a publisher's delivery, or another worker's publish.
Pending: TypeAlias = Unconfirmed | ChannelPublish


def confirm(
    pending: Pending, outcome: Outcome = Outcome.ACCEPTED, error: AmqpError | None = None
) -> None:
    """One copy of ``pending`` is stored (or refused, with ``outcome`` and ``error``)."""
    if isinstance(pending, ChannelPublish):
        pending.confirms.confirmed(pending, outcome, error)
        return
    inbound = pending.inbound
    steps = inbound.confirm(pending, outcome, error)
    if steps & RESUME:
        connection = cast(ConnectionState, inbound.owner)
        if not connection.closed:
            reading.resume(connection)
    if steps & SETTLE:
        settle(pending)


def settle(pending: Unconfirmed) -> None:
    """Settle the publisher's delivery with the outcome its copies came to."""
    error = pending.error
    deliveries.settle_held(
        pending.token,
        DISPOSITIONS[pending.outcome],
        None if error is None else condition_of(error),
    )
