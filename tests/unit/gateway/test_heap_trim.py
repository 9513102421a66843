"""When the server gives freed heap memory back (gateway/proton/heap_trim.py): after 16 MiB were
released, never twice within the interval, and never for bytes that merely moved."""

from __future__ import annotations

from sluicegate.gateway.proton import heap_trim
from sluicegate.gateway.proton.heap_trim import TRIM_AFTER, TRIM_INTERVAL, HeapTrimmer

MIB = 1024 * 1024


class Calls:
    """A stand-in for ``malloc_trim`` that records its arguments."""

    def __init__(self) -> None:
        self.pads: list[int] = []

    def __call__(self, pad: int) -> int:
        self.pads.append(pad)
        return 1


def test_freed_bytes_trim_once_they_reach_the_threshold() -> None:
    calls = Calls()
    trimmer = HeapTrimmer(calls)
    trimmer.freed(TRIM_AFTER - 1)
    trimmer.flush(0, 100.0)
    assert calls.pads == []
    trimmer.freed(1)
    trimmer.flush(0, 100.0)
    assert calls.pads == [0]
    assert trimmer.trims == 1
    assert trimmer.released == 0


def test_bytes_leaving_the_queues_count_from_their_peak() -> None:
    calls = Calls()
    trimmer = HeapTrimmer(calls)
    trimmer.flush(40 * MIB, 100.0)
    trimmer.flush(30 * MIB, 100.0)
    assert calls.pads == []  # 10 MiB below the peak
    trimmer.flush(45 * MIB, 100.0)
    trimmer.flush(20 * MIB, 100.0)
    assert calls.pads == [0]  # 25 MiB below the new peak
    trimmer.flush(10 * MIB, 100.0 + TRIM_INTERVAL)
    assert calls.pads == [0]  # the peak is where the last trim left it: 10 MiB below


def test_trims_are_an_interval_apart_and_a_held_back_one_comes_later() -> None:
    calls = Calls()
    trimmer = HeapTrimmer(calls)
    trimmer.freed(TRIM_AFTER)
    trimmer.flush(0, 100.0)
    trimmer.freed(TRIM_AFTER)
    trimmer.flush(0, 100.0 + TRIM_INTERVAL / 2)
    assert len(calls.pads) == 1
    trimmer.flush(0, 100.0 + TRIM_INTERVAL)
    assert len(calls.pads) == 2


def test_glibc_has_malloc_trim() -> None:
    """The server runs on glibc (the Dockerfile's image, CI): the call is found."""
    assert heap_trim._malloc_trim() is not None
