"""Giving the C heap's free pages back to the operating system after a large release.

glibc's ``free`` returns memory to the kernel only from the top of its heaps: pages freed in
the middle stay in the process, counted in its RSS, until ``malloc_trim`` hands them back.
A consumer that took 200,000 deliveries unsettled and dropped its socket left 180 MiB in the
server after everything it held was freed (issue 31). Releases are counted where they happen
(a closed connection's records, freed; bytes leaving the queues) and the heap is trimmed once
they add up to :data:`TRIM_AFTER`, at most once per :data:`TRIM_INTERVAL`, at the end of a
pass of the reactor (``Broker.flush``): never per message.

This module is the one place that calls the C library's allocator; where there is no glibc
(musl, macOS) there is nothing to call, and freed memory stays as that allocator keeps it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Final

# Bytes released before a trim is worth it: the slack the issue allows an attack to leave.
TRIM_AFTER: Final = 16 * 1024 * 1024
# Seconds between two trims at the least. A trim walks every free chunk of every arena: 30 ms
# on a 500 MiB heap freed in a checkerboard (measured), so at most 0.6 % of the reactor's
# time even when a client releases that much all the time. The expiry timer wakes the reactor
# every 50 ms (gateway/expiry.py), so a trim held back by the interval runs soon after it.
TRIM_INTERVAL: Final = 5.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


class HeapTrimmer:
    """Counts released bytes and trims the heap when they are many."""

    __slots__ = ("_last", "_peak", "_trim", "released", "trims")

    def __init__(self, trim: Callable[[int], int] | None = None) -> None:
        self._trim = _malloc_trim() if trim is None else trim
        # Bytes freed since the last trim, besides those that left the queues.
        self.released = 0
        # The most the queues held since the last trim: what they hold less is released.
        self._peak = 0
        self._last = float("-inf")
        self.trims = 0

    def freed(self, nbytes: int) -> None:
        """``nbytes`` were freed (a closed connection's records, as they went)."""
        self.released += nbytes

    def flush(self, held: int, now: float) -> None:
        """The end of a reactor pass: the queues hold ``held`` bytes; trim if it is time."""
        peak = self._peak
        if held > peak:
            self._peak = peak = held
        if self.released + peak - held < TRIM_AFTER or now - self._last < TRIM_INTERVAL:
            return
        self.released = 0
        self._peak = held
        self._last = now
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
