"""Proton's C functions for the per-message path, called through the cffi module proton is built on.

Proton's Python classes build a wrapper object (a C incref, a record lookup, an attribute dict)
each time a delivery or link is touched: profiled, that was most of a receiver's time. The
senders and receivers keep the raw ``pn_link_t`` pointer of their one link and drive it with the
same C calls the wrappers make, minus the wrappers. Everything else uses the Python API.
"""

from __future__ import annotations

from typing import Any

from cproton_ffi import ffi, lib
from proton import Link

__all__ = ["ffi", "lib", "link_pointer"]


def link_pointer(link: Link) -> Any:
    """The ``pn_link_t *`` behind a proton ``Link`` (its wrapper keeps it alive)."""
    return link._impl
