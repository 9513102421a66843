"""Giving back the payload buffer proton keeps in every delivery once its bytes are gone.

Proton copies a message's bytes into its delivery's buffer (``pn_link_send``, or a transfer
frame arriving), and trims them once framed or read, but never shrinks the buffer: a delivery
keeps the capacity of the largest message it carried for as long as it lives, and proton's
per-connection pool of settled deliveries keeps it after that. An unsettled delivery of a 4 KiB
message then costs 8 KiB (the buffer doubles from 64 bytes), that is a second copy of every
message a consumer has not settled yet (issue 16, finding 5). Proton's API has no call to
release it, so this module frees the bytes of the delivery's emptied buffer, through the
layout of ``pn_delivery_t`` and ``pn_buffer_t`` in proton 0.40 (``c/src/core/engine-internal.h``
and ``buffer.c``; pyproject.toml pins proton below 0.41). At import the layout is checked on a
scratch delivery, through proton's public API; if it does not match, nothing is ever swapped
and a warning says so.
"""

from __future__ import annotations

import logging
from typing import Any, Final, TypeAlias

from cffi import FFI
from cproton import ffi as proton_ffi
from cproton import lib

log = logging.getLogger("sluicegate")

# Buffers up to this capacity are left alone: a small message's buffer costs less than a swap.
KEEP: Final = 256
# A delivery (``pn_delivery_t *``) held until proton has framed its bytes, and its buffer.
Held: TypeAlias = tuple[Any, Any]

_ffi = FFI()
_ffi.cdef(
    """
    typedef struct { size_t size; const char *start; } pn_bytes_t;
    typedef struct { pn_bytes_t info_raw; void *name; void *description; void *info; }
        pn_condition_t;
    typedef struct {
        pn_condition_t condition; uint64_t type; void *data; pn_bytes_t data_raw;
        void *annotations; pn_bytes_t annotations_raw; uint64_t section_offset;
        uint32_t section_number; bool failed; bool undeliverable; bool settled;
    } pn_disposition_t;
    typedef struct { uint32_t id; bool sending; bool sent; bool init; } pn_delivery_state_t;
    typedef struct { char *bytes; uint32_t capacity; uint32_t start; uint32_t size; }
        pn_buffer_t;
    typedef struct {
        pn_disposition_t local; pn_disposition_t remote; pn_bytes_t tag; void *link;
        void *unsettled_next; void *unsettled_prev; void *work_next; void *work_prev;
        void *tpwork_next; void *tpwork_prev; pn_delivery_state_t state;
        pn_buffer_t *bytes; void *context;
        bool updated; bool settled; bool work; bool tpwork; bool done; bool referenced;
        bool aborted;
    } pn_delivery_t;
    """
)


_DELIVERY: Final = _ffi.typeof("pn_delivery_t *")
# An empty ``pn_buffer_t`` (no bytes, capacity 0), copied over a freed one: one assignment
# where setting its fields one by one cost three times as much through cffi. The pointer owns
# the struct's memory.
_EMPTY_BUFFER: Final = _ffi.new("pn_buffer_t *")
_NO_BUFFER: Final = _EMPTY_BUFFER[0]


def _view(delivery: Any) -> Any:
    """Proton's delivery pointer as our declaration of its struct: a pointer cast (cffi casts
    between pointer types of any FFI), a fifth of the cost of going through an address."""
    return _ffi.cast(_DELIVERY, delivery)


def release(delivery: Any) -> None:
    """Give back the buffer of a delivery whose bytes have all been framed or read."""
    if not ENABLED:
        return
    view = _view(delivery)
    buffer = view.bytes
    if buffer.capacity <= KEEP or buffer.size:
        return
    _empty(buffer)


def settled_here(delivery: Any) -> bool:
    """Whether the server settled the delivery (proton's API tells only the peer's settlement).
    False where the layout is not known: a refused delivery's bytes then stay as proton keeps
    them."""
    return ENABLED and bool(_view(delivery).local.settled)


def drop(delivery: Any) -> None:
    """Throw away the bytes proton holds of a delivery the server refused before its end.

    Proton forgets a delivery the server settled only when it next writes to the connection
    (``pni_process`` runs from its output): while the client does not read, the server's output
    is full, and every further frame of the delivery is appended to its buffer, a whole message
    over ``max_message_size`` in the end (adversary seed 65401, docs/bounds.md). Dropped at each
    of its frames' events, a refused delivery holds at most one read's bytes.
    """
    if ENABLED:
        buffer = _view(delivery).bytes
        if buffer.capacity:
            _empty(buffer)


def _empty(buffer: Any) -> None:
    """Free a ``pn_buffer_t``'s bytes: it is then as ``pn_buffer(0)`` makes it, and proton
    allocates again if the delivery is reused (``pn_buffer_ensure``). Proton allocates them
    with the C library's ``malloc`` (``pni_mem_suballocate``), freed with its ``free``, which
    cproton exports: a compiled call, where one through libffi cost five times as much."""
    lib.free(buffer.bytes)
    buffer[0] = _NO_BUFFER


def give_back(held: list[Held], sent: list[Any], framing: bool) -> list[Held]:
    """Give back the buffers of unsettled deliveries proton has framed; return those it has
    not, held (``pn_incref``) with their buffer until it has.

    ``held`` come from earlier calls; ``sent`` are deliveries handed to proton since the last
    call, not held: nothing freed them since (proton frees an unsettled delivery only with
    its connection, and the calls come in the same reactor pass). Each carried more than
    :data:`KEEP` bytes, so its buffer holds more than that. While ``framing`` (the
    connection is open) a delivery whose bytes proton still has waits; else it is let go as
    it is. Proton frames no more than its output buffer takes, so a delivery often waits a
    pass or two: its buffer, whose place in the delivery only this module changes, is kept
    with it and looked at directly, one attribute read where a look through proton's API and
    the delivery cost several calls through cffi.
    """
    if not ENABLED:
        return []
    waiting: list[Held] = []
    decref, incref, keep = lib.pn_decref, lib.pn_incref, KEEP
    for entry in held:
        buffer = entry[1]
        if buffer.size:
            if framing:
                waiting.append(entry)
                continue
        elif buffer.capacity > keep:
            _empty(buffer)
        decref(entry[0])
    cast, delivery_type, free, empty = _ffi.cast, _DELIVERY, lib.free, _NO_BUFFER
    for delivery in sent:
        buffer = cast(delivery_type, delivery).bytes
        if buffer.size:
            if framing:
                incref(delivery)
                waiting.append((delivery, buffer))
        else:
            # Emptied as _empty does, in the loop: one delivery of each message sent.
            free(buffer.bytes)
            buffer[0] = empty
    return waiting


def _layout_matches() -> bool:
    """Send known bytes on a scratch delivery and find them where the layout says, and its
    settlement once settled."""
    connection = lib.pn_connection()
    try:
        session = lib.pn_session(connection)
        link = lib.pn_sender(session, b"layout")
        tag = proton_ffi.from_buffer(b"t")
        delivery = lib.pn_delivery(link, (1, tag))
        payload = bytes(range(256)) * 4
        lib.pn_link_send(link, proton_ffi.from_buffer(payload), len(payload))
        view = _view(delivery)
        buffer = view.bytes
        found = bool(
            buffer != _ffi.NULL
            and buffer.size == len(payload) == lib.pn_delivery_pending(delivery)
            and buffer.capacity >= buffer.size
            and _ffi.buffer(buffer.bytes + buffer.start, buffer.size)[:] == payload
            and not view.local.settled
        )
        lib.pn_incref(delivery)  # a settled delivery may be freed at once
        lib.pn_delivery_settle(delivery)
        settled = bool(view.local.settled)
        lib.pn_decref(delivery)
        return found and settled
    finally:
        lib.pn_connection_release(connection)


ENABLED: Final = _layout_matches()
if not ENABLED:
    log.warning("proton's delivery layout is not 0.40's: delivery buffers are not given back")
