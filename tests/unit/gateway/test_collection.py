"""Cyclic garbage collection runs on the reactor thread only (adversary seed 65972,
gateway/collection.py): run by whichever thread allocated, the metrics endpoint's thread freed
a connection's proton objects beside the reactor, and the worker aborted."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from support.collector import collector_off

from sluicegate.gateway.collection import OLDEST, ReactorCollection, generation_due

THRESHOLDS = (700, 10, 10)


@pytest.mark.parametrize(
    ("counts", "pending", "total", "due"),
    [
        ((700, 0, 0), 0, 0, None),  # at the threshold, not past it
        ((701, 0, 0), 0, 0, 0),
        ((701, 11, 0), 0, 0, 1),
        ((701, 11, 11), 0, 0, OLDEST),
        # The oldest generation waits until what reached it is a quarter of what it held.
        ((701, 11, 11), 249, 1000, 1),
        ((701, 5, 11), 250, 1000, OLDEST),
    ],
)
def test_the_generation_due_is_cpythons(
    counts: tuple[int, int, int], pending: int, total: int, due: int | None
) -> None:
    assert generation_due(counts, THRESHOLDS, pending, total) == due


def test_a_threshold_of_zero_collects_nothing() -> None:
    assert generation_due((10**6, 100, 100), (0, 10, 10), 0, 0) is None


class Cycle:
    """An object in a reference cycle, as a proton wrapper left in one would be."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collection_off() -> Iterator[list[tuple[str, int]]]:
    """Automatic collection off, as in a worker; yields the (phase, thread) of each collection."""
    seen: list[tuple[str, int]] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        seen.append((phase, threading.get_ident()))

    with collector_off():
        gc.callbacks.append(record)
        try:
            yield seen
        finally:
            gc.callbacks.remove(record)


def test_cycles_made_on_another_thread_are_collected_only_where_the_collections_run(
    collection_off: list[tuple[str, int]],
) -> None:
    collection = ReactorCollection()
    refs: list[weakref.ref[Cycle]] = []

    def allocate() -> None:
        refs.extend(weakref.ref(Cycle()) for _ in range(20 * collection.thresholds[0]))

    other = threading.Thread(target=allocate)
    other.start()
    other.join()
    assert collection_off == [], "the allocating thread ran no collection"
    assert all(ref() is not None for ref in refs)
    for _ in range(OLDEST + 1):
        collection.run_due()
    here = threading.get_ident()
    assert collection_off
    assert {thread for _, thread in collection_off} == {here}
    assert sum(collection.collections) >= 1
    gc.collect()  # whatever generation a run left them in, they are garbage
    assert all(ref() is None for ref in refs)


def test_the_collections_move_up_the_generations_as_cpythons_do(
    collection_off: list[tuple[str, int]],
) -> None:
    collection = ReactorCollection()
    # As in a worker, whose start-up objects gc.freeze() moved out of the oldest generation;
    # a test process's is as large as the tests before made it, and its first collection
    # would wait for a quarter of that.
    collection.total = 0
    kept: list[Cycle] = []
    for _ in range(200):
        # Survivors reach the older generations; each round passes the youngest threshold.
        kept.extend(Cycle() for _ in range(collection.thresholds[0] + 1))
        collection.run_due()
    assert collection.collections[0] > collection.collections[1] > 0
    assert collection.collections[OLDEST] >= 1
    assert collection.pending < len(kept)
