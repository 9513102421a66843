"""The counts a quorum queue stamps on a message that comes back: RabbitMQ's
``x-delivery-count`` and ``x-acquired-count`` message annotations.

RabbitMQ 4.2's quorum queue annotates a message it delivers again with ``x-delivery-count``,
the times it was acquired and came back (released, modified, its consumer gone), absent on the
first delivery; RabbitMQ 4.3 names that count ``x-acquired-count`` (its own guide's advice for
counting acquisitions). Both carry it here, as longs, the type RabbitMQ gives integers it
annotates. The header's ``delivery-count`` (failed deliveries only) is separate.
"""

from __future__ import annotations

import struct
from typing import Final

from sluicegate.wire.codec import Encoded, Symbol, encode

X_DELIVERY_COUNT: Final = Symbol("x-delivery-count")
X_ACQUIRED_COUNT: Final = Symbol("x-acquired-count")
_LONG: Final = struct.Struct(">q")


def redelivery_annotations(acquired: int) -> bytes:
    """The encoded annotations map for a message acquired ``acquired`` times before."""
    count = Encoded(b"\x81" + _LONG.pack(acquired))
    return encode({X_DELIVERY_COUNT: count, X_ACQUIRED_COUNT: count})
