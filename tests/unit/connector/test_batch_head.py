"""Which buffered messages make ``mode=queue``'s next batch under its row and byte limits."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.spark.queue_receiver import batch_head


def _greedy(sizes: list[int], max_rows: int | None, max_bytes: int | None) -> int:
    """Message by message: stop at the row limit, or before the first message that would take
    the total over the byte limit, unless it is the first."""
    rows = total = 0
    for size in sizes:
        if max_rows is not None and rows == max_rows:
            break
        if max_bytes is not None and rows and total + size > max_bytes:
            break
        rows += 1
        total += size
    return rows


@given(st.data())
def test_a_batch_is_the_longest_run_within_both_limits_and_never_empty(
    data: st.DataObject,
) -> None:
    sizes = data.draw(st.lists(st.integers(0, 50), max_size=30))
    max_rows = data.draw(st.none() | st.integers(1, 40))
    # A limit that some run of messages meets exactly, or any limit.
    totals = [total for total in accumulate(sizes) if total > 0]
    exact = st.sampled_from(totals) if totals else st.nothing()
    max_bytes = data.draw(st.none() | exact | st.integers(1, 200))
    rows, size = batch_head(sizes, max_rows, max_bytes)
    assert rows == _greedy(sizes, max_rows, max_bytes)
    assert size == sum(sizes[:rows])
