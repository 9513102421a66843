"""Proton's C delivery API for the per-message path, where its Python wrappers cost more than
the work they wrap.

Wrapping a ``pn_delivery_t`` allocates a ``Delivery``, a record dictionary and two
``Disposition`` objects; ``delivery.link`` wraps the link again to read one attribute; and
``Delivery.update`` converts three empty Python values to C before setting the state. Profiled,
those wrappers were half of the server's CPU per message (``docs/performance.md``). Here a
delivery is the bare ``pn_delivery_t *`` that proton's collector hands out; every function is
one or two calls into proton's C library through cffi.

A bare pointer holds no reference: code that keeps a delivery past the event that brought it
(a publisher's transfer waiting for an fsync) takes one with :func:`hold` and gives it back
with :func:`settle_held` (or ``pn_decref``), as proton's ``Wrapper`` does with
``pn_incref``/``pn_decref``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypeAlias

from cproton import ffi, lib
from proton import Condition, Data, Delivery

from sluicegate.gateway.proton import payload_buffers
from sluicegate.gateway.state import RECORD, IncomingLinkState, OutgoingLinkState

if TYPE_CHECKING:
    from sluicegate.gateway.management.node import Pair

# A ``pn_delivery_t *`` from cffi: opaque, compared and hashed by address.
CDelivery: TypeAlias = Any
_NULL: Final = ffi.NULL
# The per-message calls of an outgoing transfer, made by ``Sending.pump`` itself: create the
# delivery with its tag (a ``(size, from_buffer(bytes))`` pair), write the whole message (cffi
# passes ``bytes`` to a ``char *`` as they are, other buffers need ``from_buffer``), advance.
from_buffer: Final = ffi.from_buffer
new_delivery: Final = lib.pn_delivery
write: Final = lib.pn_link_send


def link_state(delivery: CDelivery) -> IncomingLinkState | OutgoingLinkState | Pair | None:
    """The gateway's record of the delivery's link, as ``link.sg`` reads it but unwrapped."""
    handle = lib.pn_record_get_py(lib.pn_link_attachments(lib.pn_delivery_link(delivery)))
    if handle == _NULL:
        return None
    state: IncomingLinkState | OutgoingLinkState | Pair | None = ffi.from_handle(handle).get(RECORD)
    return state


def link(delivery: CDelivery) -> Any:
    """The delivery's ``pn_link_t *``, to compare with another."""
    return lib.pn_delivery_link(delivery)


def on_receiver(delivery: CDelivery) -> bool:
    """Whether the delivery came in on a receiving link (a publisher's, as the client sees it)."""
    return bool(lib.pn_link_is_receiver(lib.pn_delivery_link(delivery)))


def receive(link: Any, delivery: CDelivery, size: int) -> memoryview:
    """Read the current delivery's ``size`` bytes into a new buffer, seen through a view.

    The router makes the one immutable copy a queue stores, splicing sections in as it copies,
    so a message is copied twice in all (proton's own ``Link.recv`` copies three times and the
    splice twice more).
    """
    buffer = bytearray(size)
    if size:
        lib.pn_link_recv(link, ffi.from_buffer(buffer), size)
        if size > payload_buffers.KEEP:
            payload_buffers.release(delivery)
    return memoryview(buffer)


def tag_number(delivery: CDelivery) -> int:
    """The delivery tag as the number the server wrote in decimal ASCII."""
    tag = lib.pn_delivery_tag(delivery)
    return int(ffi.unpack(tag.start, tag.size))


def current(link: Any) -> CDelivery | None:
    """The delivery a ``pn_link_t *`` is receiving now, if any."""
    delivery = lib.pn_link_current(link)
    return None if delivery == _NULL else delivery


def hold(delivery: CDelivery) -> None:
    """Keep the delivery alive past the event that brought it."""
    lib.pn_incref(delivery)


def settle_as(delivery: CDelivery, state: int) -> None:
    """Settle a delivery of the current event with ``state``: proton drops what is left of it."""
    lib.pn_delivery_update(delivery, state)
    lib.pn_delivery_settle(delivery)


def settle_held(delivery: CDelivery, state: int, condition: Condition | None = None) -> None:
    """Settle a held delivery with ``state`` (unless the peer settled it) and let it go.

    A ``condition`` (a rejection's error) goes through proton's wrapper, which converts it.
    """
    if not lib.pn_delivery_settled(delivery):
        if condition is None:
            lib.pn_delivery_update(delivery, state)
        else:
            wrapped = Delivery(delivery)  # type: ignore[no-untyped-call]
            wrapped.local.condition = condition
            wrapped.update(state)
    lib.pn_delivery_settle(delivery)
    lib.pn_decref(delivery)


def wrap(delivery: CDelivery) -> Delivery:
    """Proton's wrapper, for the rare paths that need its API."""
    return Delivery(delivery)  # type: ignore[no-untyped-call]


# Whether it is the delivery its link is receiving now (a receiver link's current one).
readable = lib.pn_delivery_readable
partial = lib.pn_delivery_partial
pending = lib.pn_delivery_pending
aborted = lib.pn_delivery_aborted
settled = lib.pn_delivery_settled
settle = lib.pn_delivery_settle
remote_state = lib.pn_delivery_remote_state
advance = lib.pn_link_advance


def remote_failed(delivery: CDelivery) -> bool:
    """Whether the peer's modified outcome says delivery-failed."""
    return bool(lib.pn_disposition_is_failed(lib.pn_delivery_remote(delivery)))


def remote_undeliverable(delivery: CDelivery) -> bool:
    """Whether the peer's modified outcome says undeliverable-here."""
    return bool(lib.pn_disposition_is_undeliverable(lib.pn_delivery_remote(delivery)))


def remote_annotations(delivery: CDelivery) -> bytes | None:
    """The message-annotations of the peer's modified outcome, encoded; None if it has none."""
    data = Data(lib.pn_disposition_annotations(lib.pn_delivery_remote(delivery)))
    data.rewind()
    if data.next() is None:
        return None
    encoded: bytes = data.encode()
    return encoded
