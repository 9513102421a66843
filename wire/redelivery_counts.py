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
from functools import lru_cache
from typing import Final

from sluicegate.wire.amqp_types import Encoded, Symbol
from sluicegate.wire.annotations import merge_annotations
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import (
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    iter_sections,
)

X_DELIVERY_COUNT: Final = Symbol("x-delivery-count")
X_ACQUIRED_COUNT: Final = Symbol("x-acquired-count")
_LONG: Final = struct.Struct(">q")
# Stamped sections by the section they replace and the count: messages of one publisher carry
# the same annotations (most often only the x-exchange/x-routing-key the router spliced in,
# gateway/rules/routing.py), so a return costs a lookup, not a decode and an encode. Only small
# sections are kept, and few: a table that fills up is emptied, never grown.
_STAMPED: Final[dict[tuple[bytes, int], bytes]] = {}
_STAMPED_MAX: Final = 1024
_STAMPED_SECTION_MAX: Final = 256


@lru_cache(maxsize=64)
def redelivery_annotations(acquired: int) -> bytes:
    """The encoded annotations map for a message acquired ``acquired`` times before."""
    count = Encoded(b"\x81" + _LONG.pack(acquired))
    return encode({X_DELIVERY_COUNT: count, X_ACQUIRED_COUNT: count})


def with_redelivery_counts(payload: bytes, acquired: int) -> bytes:
    """``payload`` with the counts in its message annotations, as
    ``merge_annotations(payload, redelivery_annotations(acquired))`` makes it; the body is never
    decoded. Raises ``DecodeError``, changing nothing, if the sections are malformed."""
    start = end = 0
    for code, section_start, _, section_end in iter_sections(payload, until=PROPERTIES):
        if code == MESSAGE_ANNOTATIONS:
            start, end = section_start, section_end
            break
        if code not in (HEADER, DELIVERY_ANNOTATIONS):
            start = end = section_start
            break
        start = end = section_end
    section = payload[start:end]
    key = (section, acquired)
    stamped = _STAMPED.get(key)
    if stamped is None:
        stamped = merge_annotations(section, redelivery_annotations(acquired))
        if len(section) <= _STAMPED_SECTION_MAX:
            if len(_STAMPED) >= _STAMPED_MAX:
                _STAMPED.clear()
            _STAMPED[key] = stamped
    return b"".join((payload[:start], stamped, payload[end:]))
