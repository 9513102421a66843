"""The publish path's last step: a stored (or refused) copy confirmed to its publisher.

Both ways a copy is stored end here: an in-memory queue's enqueue (gateway/publishing.py) and
the log's fsync that covers a persistent one (gateway/durability.py). The pure inbound session
decides (session/inbound.py); this module applies its answer: reads resume, and the last copy
settles the delivery with its outcome.
"""

from __future__ import annotations

from typing import Final, cast

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


def confirm(
    pending: Unconfirmed, outcome: Outcome = Outcome.ACCEPTED, error: AmqpError | None = None
) -> None:
    """One copy of ``pending`` is stored (or refused, with ``outcome`` and ``error``)."""
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
