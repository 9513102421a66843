"""Where a micro-batch of ``maxBytesPerTrigger`` ends in a stream: sizes of messages read ahead.

Spark fixes a micro-batch's end offset in its offset log before any task reads, and the gateway
tells offsets but not byte positions; so the streaming runner reads the stream ahead of the
batches (``spark.stream_source.SizeScan``) and records each message's offset and encoded size
here. A batch from ``start`` then ends before the first message that would take it past the
limit, or after one message if that message alone is larger. Pure: no proton, no clock.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Final

# Entries below the current batch are dropped in bulk once this many have accumulated, so
# trimming costs amortised constant time per message.
COMPACT_AFTER: Final = 4096


class SizeIndex:
    """The encoded sizes of a stream's messages from ``origin`` up to ``position``.

    Offsets may have gaps (retention drops the head while it is read), so entries are
    ``(offset, cumulative bytes)`` pairs rather than a dense array.
    """

    def __init__(self, origin: int) -> None:
        self.origin = origin
        # Every offset in [origin, position) that holds a message is recorded.
        self.position = origin
        self._offsets: list[int] = []
        self._ends: list[int] = []  # bytes from the first entry through this one
        self._base = 0  # entries before it are below the last batch start: dropped
        self._floor = 0  # the cumulative bytes of the entries compacted away

    def covers(self, start: int) -> bool:
        """Whether batches from ``start`` can be planned here (else read again from ``start``)."""
        return self.origin <= start <= self.position

    def record(self, offset: int, size: int) -> None:
        """A message read at ``offset`` of ``size`` bytes; offsets come in increasing order."""
        if offset < self.position:
            raise ValueError(f"offset {offset} read again (already at {self.position})")
        self._offsets.append(offset)
        self._ends.append((self._ends[-1] if self._ends else self._floor) + size)
        self.position = offset + 1

    def discard_below(self, start: int) -> None:
        """Forget messages before ``start``: Spark has planned past them."""
        self._base = bisect_left(self._offsets, start, lo=self._base)
        self.origin = max(self.origin, start)
        if self._base >= COMPACT_AFTER and self._base * 2 >= len(self._offsets):
            self._floor = self._ends[self._base - 1]
            del self._offsets[: self._base]
            del self._ends[: self._base]
            self._base = 0

    def _before(self, index: int) -> int:
        return self._ends[index - 1] if index > 0 else self._floor

    def end_within(self, start: int, stop: int, max_bytes: int) -> int | None:
        """The end offset of a batch from ``start``, at most ``stop``; None if unknown yet.

        The batch holds every message of ``[start, end)``; their sizes sum to at most
        ``max_bytes``, unless one message alone is larger (then it is the whole batch).
        """
        first = bisect_left(self._offsets, start, lo=self._base)
        fitting = bisect_right(self._ends, self._before(first) + max_bytes, lo=first)
        if fitting < len(self._offsets) and self._offsets[fitting] < stop:
            if fitting == first:
                return self._offsets[first] + 1
            return self._offsets[fitting]
        return stop if self.position >= stop else None

    def credit_hint(self, start: int, max_bytes: int, window: int) -> int:
        """How many more messages to read to find the batch's end: from their mean size.

        Between 1 and ``window``; one past the estimate, to see the message that overflows.
        """
        first = bisect_left(self._offsets, start, lo=self._base)
        known = len(self._offsets) - first
        if known == 0:
            return min(window, 16)  # nothing measured yet: a small first look
        total = self._ends[-1] - self._before(first)
        mean = max(1, total // known)
        missing = max(0, max_bytes - total)
        return max(1, min(window, missing // mean + 1))
