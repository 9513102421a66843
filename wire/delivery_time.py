"""The delivery time a consumer's ``modified`` outcome asks for: RabbitMQ 4.3's delayed retry.

A consumer that settles with ``modified`` and the message annotation ``x-opt-delivery-time``
(milliseconds since the epoch, as a long or a timestamp) asks a quorum queue not to deliver the
message again before then (RabbitMQ's quorum queue guide, "Explicit Delivery Time"). Only the
outcome's own annotations are read, once per settled range, never a message's.
"""

from __future__ import annotations

from typing import Final

from sluicegate.wire.amqp_types import Symbol
from sluicegate.wire.annotations import map_entries
from sluicegate.wire.decoding import decode

X_OPT_DELIVERY_TIME: Final = Symbol("x-opt-delivery-time")


def delivery_time(annotations: bytes) -> int | None:
    """The ``x-opt-delivery-time`` of a checked annotations map; None if absent or not an
    integer (RabbitMQ ignores a value it cannot read as a time)."""
    for key, _, value in map_entries(annotations):
        if key == X_OPT_DELIVERY_TIME:
            when, _ = decode(value, 0)
            if isinstance(when, int) and not isinstance(when, bool):
                return when
            return None
    return None
