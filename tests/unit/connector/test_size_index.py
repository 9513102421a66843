"""Planning ``maxBytesPerTrigger`` batches of a stream from the sizes read ahead."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.spark.size_index import COMPACT_AFTER, SizeIndex


def _index(origin: int, messages: list[tuple[int, int]]) -> SizeIndex:
    index = SizeIndex(origin)
    for offset, size in messages:
        index.record(offset, size)
    return index


def test_a_batch_ends_before_the_message_that_would_overflow() -> None:
    index = _index(10, [(10, 40), (11, 40), (12, 40), (13, 40)])
    assert index.end_within(10, 14, 100) == 12  # 80 bytes; the third would make 120
    assert index.end_within(10, 14, 120) == 13  # exactly the limit fits
    assert index.end_within(12, 14, 1000) == 14  # everything up to the tail
    assert index.end_within(10, 11, 1000) == 11  # never past stop


def test_a_message_larger_than_the_limit_is_a_batch_of_its_own() -> None:
    index = _index(0, [(0, 500), (1, 10)])
    assert index.end_within(0, 2, 100) == 1
    assert index.end_within(1, 2, 100) == 2


def test_unknown_until_the_overflowing_message_or_the_stop_is_read() -> None:
    index = _index(0, [(0, 10), (1, 10)])
    assert index.end_within(0, 5, 100) is None  # 20 bytes so far, offsets 2-4 unread
    assert index.end_within(0, 2, 100) == 2  # everything below stop is known


def test_gaps_hold_no_bytes_and_belong_to_the_batch_that_spans_them() -> None:
    index = _index(0, [(3, 60), (7, 60)])  # retention dropped 0-2 and 4-6 while reading
    assert index.end_within(0, 8, 100) == 7
    assert index.end_within(7, 8, 100) == 8


def test_what_it_covers_and_forgetting_planned_messages() -> None:
    index = _index(5, [(5, 1), (6, 1)])
    assert index.covers(5)
    assert index.covers(7)
    assert not index.covers(4)
    assert not index.covers(8)
    index.discard_below(6)
    assert not index.covers(5)
    assert index.end_within(6, 7, 1) == 7
    with pytest.raises(ValueError, match="read again"):
        index.record(6, 1)


def test_compaction_keeps_the_answers() -> None:
    count = COMPACT_AFTER * 3
    index = _index(0, [(offset, 10) for offset in range(count)])
    for start in range(0, count - 10, 997):
        index.discard_below(start)
        assert index.end_within(start, count, 55) == start + 5


def test_the_credit_hint_aims_at_the_limit() -> None:
    index = SizeIndex(0)
    assert index.credit_hint(0, 1000, 10_000) == 16
    index.record(0, 100)
    assert index.credit_hint(0, 1000, 10_000) == 10  # 900 bytes more at 100 each, and one
    assert index.credit_hint(0, 1000, 4) == 4
    assert index.credit_hint(0, 50, 10_000) == 1


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300)), min_size=1, max_size=60),
    st.integers(1, 1000),
    st.data(),
)
def test_the_batch_is_the_longest_run_within_the_limit(
    steps: list[tuple[int, int]], max_bytes: int, data: st.DataObject
) -> None:
    """Against a brute force over the same messages (gap before each, size)."""
    messages: list[tuple[int, int]] = []
    offset = 0
    for gap, size in steps:
        offset += gap
        messages.append((offset, size))
        offset += 1
    index = _index(0, messages)
    start = data.draw(st.integers(0, offset))
    stop = data.draw(st.integers(start, offset + 3))
    index.discard_below(start)
    end = index.end_within(start, stop, max_bytes)
    inside = [(o, s) for o, s in messages if start <= o < stop]
    if stop > offset and sum(s for _, s in inside) <= max_bytes:
        assert end is None  # it might go on past what was read
        return
    assert end is not None
    assert start <= end <= stop
    taken = [s for o, s in messages if start <= o < end]
    assert sum(taken) <= max_bytes or len(taken) == 1
    following = [s for o, s in messages if end <= o < stop]
    if following:
        assert sum(taken) + following[0] > max_bytes  # one more would overflow
    elif end < stop:  # nothing read after it yet: only an oversize message ends a batch so
        assert len(taken) == 1
        assert taken[0] > max_bytes
