"""A durable stream keeps log positions, not messages: a few bytes each, bodies on disk."""

from __future__ import annotations

import gc
from pathlib import Path

from sluicegate.queues.log.segments import SegmentWriter
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.log.stream_entries import ENTRY_BYTES
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, OffsetSpec
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.wire.annotations import read_stream_offset
from sluicegate.wire.codec import Described, encode

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


def test_a_durable_stream_counts_a_few_bytes_a_message_and_reads_bodies_back(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    queue = _stream(store)
    _publish(store, queue, 500)
    write_now(store, writer)
    gc.collect()
    assert queue.held.total == 500 * ENTRY_BYTES
    taken = _read(queue, "reader", 500)
    assert [read_stream_offset(m.read()) for m in taken] == list(range(500))
    assert [m.seq for m in taken] == list(range(500))
    # No cache: every body came back from the log.
    assert store.statistics().body_reads == 500


def test_retention_keeps_the_body_of_a_message_still_out_for_delivery(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    queue = _stream(store, {"x-max-length-bytes": 5_000})
    _publish(store, queue, 10)
    write_now(store, writer)
    [in_flight] = _read(queue, "reader", 1)
    assert isinstance(in_flight, StoredMessage)
    gc.collect()
    reads = store.statistics().body_reads
    _publish(store, queue, 200)
    assert queue.first > 0, "retention dropped the head"
    # The object a session still holds got its body before its segment may go; the entries
    # nobody held were settled without reading theirs.
    assert in_flight.pinned is not None
    assert store.statistics().body_reads == reads + 1
    assert read_stream_offset(in_flight.read()) == 0
    assert queue.held.total == (queue.next_offset - queue.first) * ENTRY_BYTES


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
