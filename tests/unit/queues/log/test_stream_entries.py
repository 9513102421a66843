"""A durable stream keeps log positions, not messages: a few bytes each, bodies on disk."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from sluicegate.queues.log import stream_entries
from sluicegate.queues.log.segments import SegmentWriter, list_segments
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.log.stream_entries import ENTRY_BYTES, SWEEP_AT, LoggedEntries
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, OffsetSpec
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.annotations import read_stream_offset
from sluicegate.wire.encoding import encode

_NOW = 1_700_000_000_000


def _stream(store: MessageStore, arguments: dict[str, object] | None = None) -> StreamQueue:
    registry = QueueRegistry(Clock(_NOW), store=store)
    queue = registry.declare_queue("s", {"x-queue-type": "stream", **(arguments or {})})
    assert isinstance(queue, StreamQueue)
    return queue


def _publish(store: MessageStore, queue: StreamQueue, count: int) -> None:
    """As the gateway does: stamp the offset, log the stamped bytes, append the stored copy."""
    for index in range(count):
        body = encode(Described(0x77, f"m{queue.next_offset} " + "x" * (index % 3) * 50))
        stamped = queue.as_stored(Message(body))
        queue.enqueue(store.enqueue("s", stamped.payload, _NOW + index))


def _read(queue: StreamQueue, reader: str, count: int) -> list[Message]:
    queue.attach(reader, ack_required=False, options=ConsumerOptions(offset=OffsetSpec("first")))
    taken, _ = queue.credit(reader, 0, count, False)
    return taken


def _logged(tmp_path: Path, count: int) -> tuple[MessageStore, SegmentWriter, StreamQueue]:
    """A durable stream with no body cache and ``count`` messages written to its log."""
    store = MessageStore(tmp_path, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    queue = _stream(store)
    _publish(store, queue, count)
    write_now(store, writer)
    return store, writer, queue


def test_a_durable_stream_counts_a_few_bytes_a_message_and_reads_bodies_back(
    tmp_path: Path,
) -> None:
    store, _, queue = _logged(tmp_path, 500)
    gc.collect()
    assert queue.held.total == 500 * ENTRY_BYTES
    taken = _read(queue, "reader", 500)
    assert [read_stream_offset(m.read()) for m in taken] == list(range(500))
    assert [m.seq for m in taken] == list(range(500))
    # No cache: every body came back from the log.
    assert store.statistics().body_reads == 500


def _ten_written(tmp_path: Path) -> tuple[MessageStore, SegmentWriter, StreamQueue]:
    """A durable stream of 5,000 bytes at most over 4 KiB segments, with no body cache, and
    ten messages written to its log."""
    store = MessageStore(tmp_path, segment_size=4096, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    queue = _stream(store, {"x-max-length-bytes": 5_000})
    _publish(store, queue, 10)
    write_now(store, writer)
    return store, writer, queue


def _segments_gone(store: MessageStore, writer: SegmentWriter, taken: list[Message]) -> None:
    """Write what retention settled: compaction deletes the segments of ``taken``."""
    write_now(store, writer)
    write_now(store, writer)
    on_disk = set(list_segments(store.directory))
    assert not {m.segment for m in taken if isinstance(m, StoredMessage)} & on_disk
    assert min(on_disk) > 1, "the first segments were deleted"


def test_a_reader_takes_bodies_with_its_messages_and_retention_leaves_them_whole(
    tmp_path: Path,
) -> None:
    store, writer, queue = _ten_written(tmp_path)
    in_flight = _read(queue, "reader", 10)
    assert store.statistics().body_reads == 10
    # Each message owns its body: nothing remembers it, retention settles its entry unread.
    assert all(type(m) is Message for m in in_flight)
    _publish(store, queue, 300)
    assert queue.first > 10, "retention dropped them"
    _segments_gone(store, writer, in_flight)
    assert [read_stream_offset(m.read()) for m in in_flight] == list(range(10))
    assert [m.seq for m in in_flight] == list(range(10))
    assert store.statistics().body_reads == 10
    assert queue.held.total == (queue.next_offset - queue.first) * ENTRY_BYTES


def test_bodies_past_what_a_take_reads_are_kept_when_retention_drops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, writer, queue = _ten_written(tmp_path)
    # One take reads at most TAKE_BYTES of bodies: here the first three bodies' worth.
    entries = queue.entries
    assert isinstance(entries, LoggedEntries)
    monkeypatch.setattr(stream_entries, "TAKE_BYTES", sum(entries.size(i) for i in range(3)))
    in_flight = _read(queue, "reader", 10)
    assert [type(m) for m in in_flight] == [Message] * 3 + [StoredMessage] * 7
    assert store.statistics().body_reads == 3
    gc.collect()
    _publish(store, queue, 300)
    assert queue.first > 10, "retention dropped them"
    # The objects still out got their bodies before their segment could go; entries nobody
    # held were settled without reading theirs.
    assert all(m.pinned is not None for m in in_flight if isinstance(m, StoredMessage))
    assert store.statistics().body_reads == 10
    _segments_gone(store, writer, in_flight)
    assert [read_stream_offset(m.read()) for m in in_flight] == list(range(10))
    assert queue.held.total == (queue.next_offset - queue.first) * ENTRY_BYTES


def test_messages_a_filtered_reader_holds_keep_their_bodies_and_the_rest_are_forgotten(
    tmp_path: Path,
) -> None:
    store, writer, queue = _ten_written(tmp_path)
    wanted = ConsumerOptions(offset=OffsetSpec("first"), filter=lambda message: True)
    queue.attach("filtered", ack_required=False, options=wanted)
    in_flight, _ = queue.credit("filtered", 0, 10, False)
    assert len(in_flight) == 10
    assert all(isinstance(m, StoredMessage) for m in in_flight)
    _publish(store, queue, 300)
    assert all(m.pinned is not None for m in in_flight if isinstance(m, StoredMessage))
    _segments_gone(store, writer, in_flight)
    assert [read_stream_offset(m.read()) for m in in_flight] == list(range(10))
    # Objects gone are not remembered for long: their references are swept out in bulk.
    entries = queue.entries
    assert isinstance(entries, LoggedEntries)
    del in_flight
    _publish(store, queue, 3 * SWEEP_AT)
    write_now(store, writer)
    queue.credit("filtered", 10, 3 * SWEEP_AT, False)
    assert len(entries._handed) <= SWEEP_AT


def test_a_durable_stream_comes_back_as_entries_after_a_restart(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    _publish(store, _stream(store), 3000)
    write_now(store, writer)
    store.close()
    writer.close()
    again = MessageStore(tmp_path)
    queue = _stream(again)
    queue.restore(again)
    gc.collect()
    assert queue.held.total == 3000 * ENTRY_BYTES
    assert (queue.first, queue.next_offset) == (0, 3000)
    taken = _read(queue, "reader", 3000)
    assert [read_stream_offset(m.read()) for m in taken] == list(range(3000))


def test_one_take_reads_written_bodies_from_the_log_and_unwritten_ones_from_memory(
    tmp_path: Path,
) -> None:
    store, _, queue = _logged(tmp_path, 6)
    _publish(store, queue, 6)  # not written yet: their bodies are in memory only
    taken = _read(queue, "reader", 12)
    assert [read_stream_offset(m.read()) for m in taken] == list(range(12))
    assert [m.seq for m in taken] == list(range(12))
    assert store.statistics().body_reads == 6
