"""The drained FLOW proton 0.40 will not send when a drain used up exactly all the credit.

(A grant of 2**31 or more, which proton's C ``int`` reads negative, is read back by the pure
outgoing link: ``session/outgoing_link.py``'s ``granted_credit``.)

AMQP 1.0 §2.6.7: a sender that honours a drain must answer with a FLOW (link-credit 0, drain
true, its delivery-count), and clients such as rhea wait for it. Proton sends that FLOW only from
``pn_link_drained``, which does nothing when the credit is already 0, that is when the messages
used up the whole drain: the client then waits forever. ``pn_link_drained`` only records
``drained = credit`` on the link and marks it modified, and the transport then posts the FLOW
once the link's last delivery is on the wire (``pni_process_flow_sender``). This module does the
same for a credit of 0: it sets the C field through the cffi pointer and marks the link modified
with the exported ``pn_modified``.

``pn_link_t`` is private, so the field is found by a probe when the module loads, checked
against three public getters; a proton whose layout differs fails the import instead of writing
to the wrong place.
"""

from __future__ import annotations

import ctypes
from typing import Final

import cproton_ffi
from cproton_ffi import ffi
from proton import Connection, Sender

from sluicegate.gateway.proton.internals import c_object
from sluicegate.wire.serial import SERIAL_MASK

__all__ = ["send_drained_flow"]

_lib = ctypes.CDLL(cproton_ffi.__file__)
_modified = _lib.pn_modified
_modified.restype = None
_modified.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_bool]

# Values pn_link_offered() writes into pn_link_t.available to find it; no pointer or small
# count in the struct's first words looks like either.
_PROBES: Final = (0x5A17_C3E1, 0x2BAD_F00D)
# pn_link_t holds available, credit, queued, more_id, drained as consecutive 32-bit fields.
_CREDIT, _QUEUED, _DRAINED = 1, 2, 4
# pn_link_t is a few hundred bytes; the probe gives up well beyond it.
_MAX_WORDS: Final = 512


def _probe() -> int:
    """Index in 32-bit words of ``pn_link_t.available``, checked against the getters."""
    connection = Connection()
    sender = connection.session().sender("sluicegate-layout-probe")
    words = ffi.cast("int32_t *", c_object(sender))
    sender.offered(_PROBES[0])
    index = next((i for i in range(_MAX_WORDS) if words[i] == _PROBES[0]), -1)
    sender.offered(_PROBES[1])
    delivery = sender.delivery("probe")
    sender.advance()  # queued becomes 1
    if index < 0 or words[index] != _PROBES[1] or words[index + _QUEUED] != sender.queued:
        raise ImportError("proton's pn_link_t layout is not the one gateway.proton.drain knows")
    if words[index + _CREDIT] != sender.credit or words[index + _DRAINED] != 0:
        raise ImportError("proton's pn_link_t layout is not the one gateway.proton.drain knows")
    delivery.settle()
    sender.offered(0)
    return index


_AVAILABLE: Final = _probe()


def send_drained_flow(sender: Sender) -> int:
    """Have proton send the drained FLOW for a drain that ``Sender.drained()`` will not answer.

    That is a drain that used up all the credit, or one of a grant of 2**31 or more (proton's
    credit reads negative). Returns the credit drained (0 when none was left), by which the
    delivery-count moves; does nothing and returns 0 unless the client asked for a drain.
    """
    credit = sender.credit
    if not sender.drain_mode or credit > 0:
        return 0
    words = ffi.cast("int32_t *", c_object(sender))
    # Any non-zero count: the transport adds the link's remaining credit (as the uint it
    # keeps beside our C int) to delivery-count, and the link has none left afterwards.
    words[_AVAILABLE + _DRAINED] = 1
    words[_AVAILABLE + _CREDIT] = 0
    link_address = int(ffi.cast("uintptr_t", c_object(sender)))
    connection_address = int(ffi.cast("uintptr_t", c_object(sender.connection)))
    _modified(connection_address, link_address, True)
    return credit & SERIAL_MASK
