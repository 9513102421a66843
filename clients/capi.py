"""Proton's C functions for the per-message path, called through the cffi module proton is built on.

Proton's Python classes build a wrapper object (a C incref, a record lookup, an attribute dict)
each time a delivery or link is touched: profiled, that was most of a receiver's time. The
clients keep the raw ``pn_link_t`` pointer of their links and drive them with the same C calls
the wrappers make, minus the wrappers. Everything else uses the Python API.
"""

from __future__ import annotations

from typing import Any, Final

from cproton_ffi import ffi, lib
from proton import Link

__all__ = ["ffi", "lib", "link_pointer", "take_transfers"]


def link_pointer(link: Link) -> Any:
    """The ``pn_link_t *`` behind a proton ``Link`` (its wrapper keeps it alive)."""
    return link._impl


# The scratch buffer a pass of :func:`take_transfers` receives into, made at its first message:
# most messages fit; a larger one grows it (to twice its size) for the rest of that pass.
SCRATCH_BYTES: Final = 64 * 1024


def take_transfers(link: Any, limit: int, settle: bool) -> tuple[list[Any], list[bytes], int]:
    """Up to ``limit`` complete transfers waiting on a receiver, oldest first.

    Returns their ``pn_delivery_t *`` (settled already if ``settle``), their encoded messages,
    and how many aborted transfers were dropped on the way (each spent a credit and carries no
    message; AMQP 1.0 §2.6.14).

    Each message is received into one scratch buffer and copied out once, as the ``bytes`` a
    decoder reads without copying again. A receiver's current delivery is always the one to
    read (``pn_delivery_readable`` holds for it), so the loop asks only whether it came whole.
    """
    current, partial = lib.pn_link_current, lib.pn_delivery_partial
    pending, recv, advance = lib.pn_delivery_pending, lib.pn_link_recv, lib.pn_link_advance
    aborted, settle_delivery = lib.pn_delivery_aborted, lib.pn_delivery_settle
    unpack = ffi.unpack
    scratch_size = 0
    scratch = ffi.NULL
    deliveries: list[Any] = []
    payloads: list[bytes] = []
    dropped = 0
    taken = 0
    delivery = current(link)
    while taken < limit and delivery != ffi.NULL and not partial(delivery):
        size = pending(delivery)
        if size > scratch_size:
            scratch_size = max(SCRATCH_BYTES, 2 * size)
            scratch = ffi.new("char[]", scratch_size)
        received = recv(link, scratch, size) if size else 0
        advance(link)
        if aborted(delivery):
            settle_delivery(delivery)
            dropped += 1
        else:
            if settle:
                settle_delivery(delivery)
            deliveries.append(delivery)
            payloads.append(unpack(scratch, received) if received > 0 else b"")
            taken += 1
        delivery = current(link)
    return deliveries, payloads, dropped


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
