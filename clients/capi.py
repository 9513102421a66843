"""Proton's C functions for the per-message path, called through the cffi module proton is built on.

The clients' one reach into proton's C layer and private parts (the Spark connector's included):
the server's is gateway/proton/, which clients may not import, so this module is the one
exception ruff's ban on ``cproton``/``cproton_ffi`` and tests/unit/test_layering.py allow
outside it (docs/design.md).

Proton's Python classes build a wrapper object (a C incref, a record lookup, an attribute dict)
each time a delivery or link is touched: profiled, that was most of a receiver's time. The
clients keep the raw ``pn_link_t`` pointer of their links and drive them with the same C calls
the wrappers make, minus the wrappers. Everything else uses the Python API.
"""

from __future__ import annotations

from array import array
from itertools import accumulate, pairwise
from typing import Any, Final

from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_REJECTED,
    PN_RELEASED,
    pn_condition_get_description,
    pn_condition_get_name,
    pn_condition_is_set,
    pn_delivery,
    pn_delivery_remote,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_disposition_condition,
    pn_link_advance,
    pn_link_credit,
    pn_link_send,
)
from cproton_ffi import ffi, lib
from proton import Link

__all__ = [
    "PN_ACCEPTED",
    "PN_MODIFIED",
    "PN_REJECTED",
    "PN_RELEASED",
    "ffi",
    "has_transfer",
    "lib",
    "link_pointer",
    "pn_condition_get_description",
    "pn_condition_get_name",
    "pn_condition_is_set",
    "pn_delivery",
    "pn_delivery_remote",
    "pn_delivery_remote_state",
    "pn_delivery_settle",
    "pn_disposition_condition",
    "pn_link_advance",
    "pn_link_credit",
    "pn_link_send",
    "receive_transfers",
    "take_transfers",
    "unused_credit",
]


def link_pointer(link: Link) -> Any:
    """The ``pn_link_t *`` behind a proton ``Link`` (its wrapper keeps it alive)."""
    return link._impl


# What pn_link_recv returns for an aborted delivery (proton's error.h; cffi does not export it).
PN_ABORTED: Final = -11
# The scratch buffer a pass of :func:`receive_transfers` receives into, made at its first
# message and copied into the caller's buffer whenever it fills: one copy per message, one
# allocation per pass. A larger message passes through it in several pieces.
SCRATCH_BYTES: Final = 256 * 1024
# The mean message size from which take_transfers copies each message once from a view of the
# pass rather than copying the pass and slicing it (measured, best of 15, per message: 0.27-0.29
# against 0.26-0.59 us at 270 bytes, 0.5-0.9 against 0.5-0.7 us at 4 KiB, 150-200 against 57-104
# us at 1 MiB).
COPY_EACH_FROM: Final = 4096
# recv overwrites what it uses of the scratch buffer: clearing it first would be wasted.
_uncleared = ffi.new_allocator(should_clear_after_alloc=False)


def receive_transfers(
    link: Any, limit: int, settle: bool, data: bytearray, sizes: array[int]
) -> tuple[list[Any], int]:
    """Up to ``limit`` transfers waiting complete on a receiver, oldest first, their encoded
    messages appended back to back to ``data`` and their lengths to ``sizes``.

    Returns their ``pn_delivery_t *`` (settled already if ``settle``) and how many aborted
    transfers were dropped on the way (each spent a credit and carries no message; AMQP 1.0
    §2.6.14).

    Three C calls a message. Proton appends a transfer to the newest delivery until it is
    complete and starts no other before, so of the ``pn_link_queued`` deliveries waiting only
    the newest may be partial; the one to read is always the receiver's current delivery; and
    ``pn_link_recv`` itself says when a message ended (``PN_EOS``) or was aborted
    (``PN_ABORTED``, before any byte is read).
    """
    current, recv, advance = lib.pn_link_current, lib.pn_link_recv, lib.pn_link_advance
    settle_delivery = lib.pn_delivery_settle
    queued = lib.pn_link_queued(link)
    deliveries: list[Any] = []
    dropped = 0
    if not queued:
        return deliveries, dropped
    keep, measure = deliveries.append, sizes.append
    newest = queued - 1
    room = SCRATCH_BYTES
    scratch = _uncleared("char[]", room)
    used = 0
    for index in range(min(queued, limit)):
        delivery = current(link)
        if index == newest and lib.pn_delivery_partial(delivery):
            break
        size = 0
        while (received := recv(link, scratch + used, room - used)) > 0:
            size += received
            used += received
            if used < room:
                break  # the whole message: the delivery is complete and the buffer had room
            data += ffi.buffer(scratch, used)
            used = 0
        advance(link)
        if received == PN_ABORTED:
            settle_delivery(delivery)
            dropped += 1
        else:
            if settle:
                settle_delivery(delivery)
            keep(delivery)
            measure(size)
    if used:
        data += ffi.buffer(scratch, used)
    return deliveries, dropped


def take_transfers(link: Any, limit: int, settle: bool) -> tuple[list[Any], list[bytes], int]:
    """:func:`receive_transfers` with each encoded message as its own ``bytes``, the form a
    decoder reads without copying again: deliveries, messages, aborted transfers dropped.

    Small messages are sliced from one copy of the pass (the fewest calls a message); larger
    ones are copied once each from a view of it, not twice.
    """
    received = bytearray()
    sizes = array("I")
    deliveries, dropped = receive_transfers(link, limit, settle, received, sizes)
    bounds = pairwise(accumulate(sizes, initial=0))
    if len(received) < COPY_EACH_FROM * len(sizes):
        data = bytes(received)
        return deliveries, [data[start:end] for start, end in bounds], dropped
    with memoryview(received) as view:
        return deliveries, [bytes(view[start:end]) for start, end in bounds], dropped


def has_transfer(link: Any) -> bool:
    """Whether a complete transfer waits on a receiver (one :func:`take_transfers` would take)."""
    delivery = lib.pn_link_current(link)
    return bool(
        delivery != ffi.NULL
        and lib.pn_delivery_readable(delivery)
        and not lib.pn_delivery_partial(delivery)
    )


def unused_credit(link: Any) -> int:
    """Credit a receiver has granted that the sender has not used yet (``credit - queued``)."""
    credit: int = lib.pn_link_credit(link) - lib.pn_link_queued(link)
    return credit
