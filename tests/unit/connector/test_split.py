"""Offset ranges split into tasks: contiguous, covering, never empty."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.spark.stream_source import OffsetRange, split


def test_a_range_splits_into_nearly_equal_parts() -> None:
    assert split(200, 700, 2) == [OffsetRange(200, 450), OffsetRange(450, 700)]
    assert split(0, 10, 3) == [OffsetRange(0, 3), OffsetRange(3, 6), OffsetRange(6, 10)]


def test_an_empty_range_has_no_partition() -> None:
    assert split(5, 5, 4) == []


@given(st.integers(0, 10**12), st.integers(0, 10_000), st.integers(1, 64))
def test_parts_cover_the_range_exactly(start: int, size: int, parts: int) -> None:
    ranges = split(start, start + size, parts)
    assert len(ranges) == min(parts, size)
    assert all(r.start < r.end for r in ranges)
    assert [r.start for r in ranges[1:]] == [r.end for r in ranges[:-1]]
    if ranges:
        assert (ranges[0].start, ranges[-1].end) == (start, start + size)
