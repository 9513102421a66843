"""Python's cyclic garbage collection, run on the reactor thread only.

Proton is not thread-safe, and a proton object left in a reference cycle is freed by the
collector (its wrapper's ``__del__`` gives the C object back). CPython runs a collection on
whichever thread allocates past the threshold: the metrics endpoint's thread, building a page,
ran one that freed a connection's proton objects while the reactor thread was in proton, and
the worker died of SIGABRT with every client it served (adversary seed 65972, docs/adversary.md).
So a worker turns automatic collection off once it serves (cli/serve.py) and the reactor runs
the collections CPython would have run, between two of its passes (``Server._process``).

Nothing the server frees relies on a collection (a closed connection is freed by reference
counting, gateway/state.py); this keeps whatever a cycle still holds freed, on the right thread.
"""

from __future__ import annotations

import gc
from typing import Final

# The oldest generation, whose collection walks every object the collector tracks.
OLDEST: Final = 2
# CPython's rule for the oldest generation: collected only once the objects that reached it
# since its last collection are a quarter of those it held then, so that a large heap is not
# walked again for each small growth (Modules/gcmodule.c, ``long_lived_pending``).
OLDEST_GROWTH: Final = 4


def generation_due(
    counts: tuple[int, int, int], thresholds: tuple[int, int, int], pending: int, total: int
) -> int | None:
    """The generation CPython would collect now, or None: ``counts`` and ``thresholds`` as
    ``gc.get_count()`` and ``gc.get_threshold()`` give them; ``pending`` objects moved into the
    oldest generation since its last collection, which left ``total`` there."""
    if thresholds[0] == 0 or counts[0] <= thresholds[0]:
        return None
    if counts[OLDEST] > thresholds[OLDEST] and pending >= total // OLDEST_GROWTH:
        return OLDEST
    if counts[1] > thresholds[1]:
        return 1
    return 0


class ReactorCollection:
    """The collections due, run where :meth:`run_due` is called: once per reactor pass, a
    ``gc.get_count()`` when none is due."""

    __slots__ = ("collections", "pending", "thresholds", "total")

    def __init__(self) -> None:
        self.thresholds = gc.get_threshold()
        self.pending = 0
        self.total = len(gc.get_objects(OLDEST))
        # Per generation, the collections run here (a test reads them).
        self.collections = [0, 0, 0]

    def run_due(self) -> None:
        counts = gc.get_count()
        if counts[0] <= self.thresholds[0]:
            return
        generation = generation_due(counts, self.thresholds, self.pending, self.total)
        if generation is None:
            return
        if generation == 1:
            younger = len(gc.get_objects(0)) + len(gc.get_objects(1))
            self.pending += max(0, younger - gc.collect(1))
        elif generation == OLDEST:
            gc.collect(OLDEST)
            self.pending = 0
            self.total = len(gc.get_objects(OLDEST))
        else:
            gc.collect(0)
        self.collections[generation] += 1
