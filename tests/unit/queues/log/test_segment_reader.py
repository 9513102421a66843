"""Bodies read back in windows: one pread for many, never a byte read before it was written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluicegate.queues.log import segments
from sluicegate.queues.log.segments import SegmentReader, SegmentWriter, segment_path
from sluicegate.queues.log.store import MessageStore, write_now

_NOW = 1_700_000_000_000


def _pattern(start: int, stop: int) -> bytes:
    """Bytes that say where they are: byte i of a segment is i's low byte, plus a salt."""
    return bytes((i * 7 + 3) & 0xFF for i in range(start, stop))


def _write(directory: Path, segment: int, offset: int, data: bytes) -> None:
    fd = os.open(segment_path(directory, segment), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def test_reading_on_in_log_order_takes_one_pread_for_many_bodies(tmp_path: Path) -> None:
    size = 200
    count = 5000
    _write(tmp_path, 1, 0, _pattern(0, size * count))
    reader = SegmentReader(tmp_path)
    for index in range(count):
        offset = index * size
        assert reader.read(1, offset, size) == _pattern(offset, offset + size)
    # 1 MB in windows growing from a page to 128 KiB: a few reads while they grow, then one
    # per 128 KiB.
    assert reader.preads <= 14


def test_a_window_serves_only_bytes_the_file_had_when_it_was_read(tmp_path: Path) -> None:
    _write(tmp_path, 1, 0, _pattern(0, 1000))
    reader = SegmentReader(tmp_path)
    assert reader.read(1, 0, 100) == _pattern(0, 100)
    # The segment grows after the window was read (append-only: what it had stays true).
    _write(tmp_path, 1, 1000, _pattern(1000, 3000))
    assert reader.read(1, 950, 100) == _pattern(950, 1050)
    assert reader.read(1, 1500, 100) == _pattern(1500, 1600)
    assert reader.read(1, 10, 20) == _pattern(10, 30)


def test_a_window_stops_where_the_durable_bytes_end(tmp_path: Path) -> None:
    # Bytes past the first record not yet durable may be anything while their write is retried
    # (after a failed fsync the kernel may have dropped the pages): a window must not keep them.
    _write(tmp_path, 1, 0, _pattern(0, 500) + b"\xee" * 2500)
    durable = {1: 500}
    reader = SegmentReader(tmp_path, durable.get)
    assert reader.read(1, 0, 100) == _pattern(0, 100)
    _write(tmp_path, 1, 500, _pattern(500, 3000))
    durable[1] = 3000
    assert reader.read(1, 600, 100) == _pattern(600, 700)
    assert reader.read(1, 450, 100) == _pattern(450, 550)


def test_a_read_past_the_end_of_the_segment_fails(tmp_path: Path) -> None:
    _write(tmp_path, 1, 0, _pattern(0, 1000))
    reader = SegmentReader(tmp_path)
    with pytest.raises(OSError, match="ends before offset 1100"):
        reader.read(1, 900, 200)
    with pytest.raises(OSError, match="ends before offset"):
        reader.read(1, 900, 100 + segments.LARGE_READ)


def test_a_forgotten_segment_leaves_no_window_behind(tmp_path: Path) -> None:
    _write(tmp_path, 1, 0, _pattern(0, 10_000))
    _write(tmp_path, 2, 0, _pattern(0, 10_000))
    reader = SegmentReader(tmp_path)
    assert reader.read(1, 0, 100) == _pattern(0, 100)
    assert reader.read(2, 0, 100) == _pattern(0, 100)
    reader.forget(1)
    segment_path(tmp_path, 1).unlink()
    with pytest.raises(FileNotFoundError):
        reader.read(1, 100, 100)
    assert reader.read(2, 100, 100) == _pattern(100, 200)


def test_windows_are_few_and_large_bodies_are_read_alone(tmp_path: Path) -> None:
    places = segments.WINDOWS + 4
    for segment in range(1, places + 1):
        _write(tmp_path, segment, 0, _pattern(0, 200_000))
    reader = SegmentReader(tmp_path)
    for _ in range(3):
        for segment in range(1, places + 1):
            assert reader.read(segment, 1000, 100) == _pattern(1000, 1100)
    assert len(reader._windows) == segments.WINDOWS
    assert sum(len(w.data) for w in reader._windows) <= segments.WINDOWS * segments.WINDOW_BYTES
    large = segments.LARGE_READ + 1
    preads = reader.preads
    assert reader.read(1, 50_000, large) == _pattern(50_000, 50_000 + large)
    assert reader.read(1, 50_000 + large, large) == _pattern(50_000 + large, 50_000 + 2 * large)
    assert reader.preads == preads + 2
    assert all(len(w.data) <= segments.WINDOW_BYTES for w in reader._windows)


def test_the_store_reads_no_window_into_a_batch_not_yet_written(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    first = [store.enqueue("q", b"a%04d" % i + b"." * 100, _NOW) for i in range(50)]
    write_now(store, writer)
    second = [store.enqueue("q", b"b%04d" % i + b"." * 100, _NOW) for i in range(50)]
    batch = store.take_batch()
    # The writer's first attempt leaves the batch's bytes wrong (a failed write or fsync)...
    for segment, offset, buffers in batch.writes:
        _write(tmp_path, segment, offset, b"\xee" * sum(len(b) for b in buffers))
    # ... while a reader reads the bodies written before it.
    assert [m.read() for m in first] == [b"a%04d" % i + b"." * 100 for i in range(50)]
    assert store.bodies.durable_end(second[0].segment) == second[0].record
    # The retry writes them right; only then are they durable, and read from the log.
    for segment, offset, buffers in batch.writes:
        writer.write(segment, offset, buffers)
    writer.sync()
    store.written(batch)
    assert store.bodies.durable_end(second[0].segment) is None
    assert [m.read() for m in second] == [b"b%04d" % i + b"." * 100 for i in range(50)]
    assert store.statistics().body_reads == 100
