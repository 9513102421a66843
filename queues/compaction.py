"""A queue's lazy heaps kept in proportion to what they still name.

A classic queue's heaps (expiries, delivery locks, messages released behind a walk) drop an
entry whose message changed only when they meet it (queues/deadlines.py, queues/ordering.py).
A client that acquires and releases one message again and again, or settles each delivery long
before its lock runs out, adds an entry each time and the queue meets none of them: left alone,
such a heap grew by an entry per frame of the client's, counted by no budget, and a lock's entry
kept its settled message's bytes alive until its deadline (docs/bounds.md, "a queue's lazy
heaps"). So each heap is compacted, its stale entries and repeats dropped in one pass, whenever
it has grown past twice what was live at its last compaction and :data:`COMPACT_SLACK`: O(1)
per entry amortized, and never more than twice its live entries, each a message the memory
budget counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

# Entries a heap may hold beyond twice its live ones: enough that a queue with a few live
# entries does not compact on every push, small beside what the messages they name cost.
COMPACT_SLACK: Final = 1024

# Sequence numbers, or tuples that begin with a deadline: ordered, and hashable for the repeats.
Entry = TypeVar("Entry", bound="SupportsRichComparison")


def compact(heap: list[Entry], live: Callable[[Entry], bool]) -> int:
    """Keep ``heap``'s live entries, each once, as a heap; return the length past which it is
    to be compacted again."""
    seen: set[Entry] = set()
    kept: list[Entry] = []
    for entry in heap:
        if entry not in seen and live(entry):
            seen.add(entry)
            kept.append(entry)
    heapq.heapify(kept)
    heap[:] = kept
    return 2 * len(kept) + COMPACT_SLACK
