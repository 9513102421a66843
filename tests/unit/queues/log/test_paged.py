"""Where a disk page ends: one segment, one read's span, a u16 of ids, PAGE_MESSAGES."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from sluicegate.gateway.config import ConfigError, ServerConfig
from sluicegate.queues.log import paged
from sluicegate.queues.log.paged import PAGE_SPAN, PAGED_MESSAGE_BYTES, DiskPage
from sluicegate.queues.log.placement import MAX_SEGMENT_SIZE
from sluicegate.queues.log.segments import SegmentWriter
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.paging import PAGE_MESSAGES, RESIDENT_READY
from sluicegate.queues.queue_type import Clock
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode


def _page(tmp_path: Path) -> DiskPage:
    page = DiskPage(MessageStore(tmp_path), "q", 3, 1000, 500, 0)
    page.add(1000, 1200, 500, 150, 0, 7)
    return page


def test_a_page_takes_records_of_its_segment_within_its_span_and_id_range(tmp_path: Path) -> None:
    page = _page(tmp_path)
    assert page.fits(3, 1000 + PAGE_SPAN, 500 + 0xFFFF)
    assert not page.fits(4, 1400, 501), "another segment"
    assert not page.fits(3, 1001 + PAGE_SPAN, 501), "beyond one read"
    assert not page.fits(3, 1400, 500 + 0x10000), "an id delta wider than a u16"


def test_a_page_holds_at_most_page_messages(tmp_path: Path) -> None:
    page = _page(tmp_path)
    for index in range(1, PAGE_MESSAGES):
        assert page.fits(3, 1200 + index * 10, 500 + index)
        page.add(1200 + (index - 1) * 10, 1200 + index * 10, 500 + index, 2, 0, 7)
    assert page.count == PAGE_MESSAGES
    assert not page.fits(3, 1200 + PAGE_MESSAGES * 10, 500 + PAGE_MESSAGES)
    assert page.ready_bytes == 150 + 2 * (PAGE_MESSAGES - 1)


def test_segments_larger_than_page_offsets_allow_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="segment size"):
        MessageStore(tmp_path, segment_size=MAX_SEGMENT_SIZE + 1)
    with pytest.raises(ConfigError, match="log_segment_size"):
        ServerConfig(log_segment_size=MAX_SEGMENT_SIZE + 1)


def test_a_paged_message_counts_what_its_index_allocates_within_two_bytes(
    tmp_path: Path,
) -> None:
    """The budget's count of a paged backlog against what Python allocates for it: the pages,
    their arrays with their slack. Before, 6 B were counted for ~6.8 B allocated and ~8.3 B of
    RSS in a server (the arrays' reallocations leave holes tracemalloc does not see)."""
    # No body cache: it has a row and a bound of its own.
    store = MessageStore(tmp_path, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    registry = QueueRegistry(Clock(1_700_000_000_000), store=store)
    registry.declare_queue("q")
    queue = registry.queue("q")
    body = encode(Described(0x70, [True])) + encode(Described(0x75, b"x" * 85))
    # The resident messages first: what follows is paged.
    for _ in range(RESIDENT_READY):
        queue.enqueue(store.enqueue("q", bytes(body), registry.clock.now))
    write_now(store, writer)
    count = 4 * PAGE_MESSAGES
    gc.collect()
    tracemalloc.start()
    try:
        held = registry.held.total
        before = tracemalloc.take_snapshot()
        for index in range(count):
            queue.enqueue(store.enqueue("q", bytes(body), registry.clock.now))
            if index % 1000 == 999:
                write_now(store, writer)
        write_now(store, writer)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # What the pages allocate (their objects and arrays), wherever else the test runs.
    pages = [tracemalloc.Filter(True, paged.__file__)]
    allocated = sum(
        d.size_diff
        for d in after.filter_traces(pages).compare_to(before.filter_traces(pages), "filename")
    )
    counted = registry.held.total - held
    assert counted == count * PAGED_MESSAGE_BYTES
    # What the index allocates, its slack and its pages' objects included, is counted, and at
    # most 2 B more: the allocator's holes that only RSS shows (docs/bounds.md).
    assert allocated <= counted <= allocated + 2 * count, allocated / count
