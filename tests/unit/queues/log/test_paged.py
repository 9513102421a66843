"""Where a disk page ends: one segment, one read's span, a u16 of ids, PAGE_MESSAGES."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.gateway.config import ConfigError, ServerConfig
from sluicegate.queues.log.paged import PAGE_SPAN, DiskPage
from sluicegate.queues.log.placement import MAX_SEGMENT_SIZE
from sluicegate.queues.log.store import MessageStore
from sluicegate.queues.paging import PAGE_MESSAGES


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
