"""The session windows proton 0.40 keeps in C but does not wrap in Python (docs/design.md).

``pn_session_remote_incoming_window`` is how many more TRANSFER frames the client's session will
take; proton already subtracts the frames it has put on the wire. It is exported by the cffi
extension, so it is called through ctypes here, in this one module.
"""

from __future__ import annotations

import ctypes

import cproton_ffi
from cproton_ffi import ffi
from proton import Session

from sluicegate.gateway.proton.internals import c_object

_lib = ctypes.CDLL(cproton_ffi.__file__)
_remote_incoming_window = _lib.pn_session_remote_incoming_window
_remote_incoming_window.restype = ctypes.c_uint32
_remote_incoming_window.argtypes = [ctypes.c_void_p]


def session_address(session: Session) -> int:
    """The C address of a session, computed once so that each window read is one call."""
    address: int = int(ffi.cast("uintptr_t", c_object(session)))
    return address


def remote_incoming_window(address: int) -> int:
    """Frames the client's session will still accept (AMQP 1.0 §2.5.6), as proton tracks it."""
    window: int = _remote_incoming_window(address)
    return window
