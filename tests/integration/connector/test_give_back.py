"""``mode=queue``'s runner driven as Spark drives it, without Spark: what it settles and how.

The reader plans a batch (``latestOffset``), hands its messages still encoded to tasks
(``partitions``), which decode them (``read``); Spark's commit settles them. A stop releases
what Spark never had, so that a restart sees those messages as never delivered, and returns
an uncommitted batch counted, so that ``redelivered`` marks what a sink may have written.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any

from integration.conftest import RunningServer
from proton import Message
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from support.clients import consume, publish
from support.polling import wait_until

from sluicegate.spark.options import parse_read_options
from sluicegate.spark.queue_receiver import QueueReceiver
from sluicegate.spark.queue_source import INITIAL_OFFSET, QueuePartition, QueueStreamReader
from sluicegate.spark.records import COLUMNS

Offset = dict[str, Any]


def _reader(server: RunningServer, address: str, **extra: str) -> QueueStreamReader:
    raw = {"url": server.url, "address": address, **extra}
    options = dataclasses.replace(parse_read_options(raw, streaming=True), min_partitions=2)
    return QueueStreamReader(options)


def _bodies(count: int) -> list[bytes]:
    return [f"order-{i:06d}".encode() for i in range(count)]


def _body(message: Message) -> bytes:
    body: Any = message.body  # a data section: bytes or a memoryview
    return bytes(body)


def _read(reader: QueueStreamReader, start: Offset, end: Offset) -> list[bytes]:
    """What the batch's tasks decode, in order."""
    bodies: list[bytes] = []
    for partition in reader.partitions(start, end):
        assert isinstance(partition, QueuePartition)
        for batch in reader.read(partition):
            assert batch.schema.names == list(COLUMNS)
            bodies.extend(batch.column("body").to_pylist())
    return bodies


def _next_batch(reader: QueueStreamReader, start: Offset, limit: ReadLimit) -> Offset:
    """Plan batches as Spark polls for them, until one has messages."""
    deadline = time.monotonic() + 30
    while (end := reader.latestOffset(start, limit)) == start:
        assert time.monotonic() < deadline, "no message arrived"
        time.sleep(0.05)
    return end


def _acknowledged(server: RunningServer, queue: str, count: int) -> None:
    """Until the gateway has the settlements of ``count`` messages (dispositions are async)."""
    wait_until(lambda: server.queue(queue).acknowledged == count, 30, 0.05)


def _unacked(server: RunningServer, queue: str, count: int) -> None:
    """Until the gateway has handed the receiver ``count`` messages."""
    wait_until(lambda: server.queue(queue).unacked >= count, 30, 0.05)


def test_a_batch_is_decoded_by_its_tasks_and_settled_by_the_commit(server: RunningServer) -> None:
    published = _bodies(3_000)
    publish(server.url, "/queues/runner", published)
    reader = _reader(server, "/queues/runner", credit="5000")
    try:
        start = dict(INITIAL_OFFSET)
        read: list[bytes] = []
        while len(read) < 3_000:
            end = _next_batch(reader, start, ReadMaxRows(1_000))
            assert len(reader.partitions(start, end)) == 2
            batch = _read(reader, start, end)
            assert 0 < len(batch) <= 1_000
            assert server.queue("runner").acknowledged == len(read)
            reader.commit(end)
            read += batch
            _acknowledged(server, "runner", len(read))
            start = end
        assert sorted(read) == published
        stats = server.queue("runner")
        assert (stats.acknowledged, stats.ready, stats.unacked) == (3_000, 0, 0)
    finally:
        reader.stop()


def test_an_available_now_read_ends_without_waiting_for_the_drain_its_commit_armed(
    server: RunningServer,
) -> None:
    """Once a drain found the queue empty and the buffer is read, ``take`` returns nothing at
    once: the commit's settlement grants credit with the drain flag again, and the gateway
    answers that drain only after it has processed the settlements sent before it."""
    publish(server.url, "/queues/drained", _bodies(5_000))
    options = parse_read_options({"url": server.url, "address": "/queues/drained"}, streaming=True)
    receiver = QueueReceiver(options.endpoint, 6_000)
    try:
        receiver.drain()
        # More than there is: it returns when the gateway answers the drain, 1,000 credit unused.
        batch = receiver.take(6_000, None, 30)
        assert len(batch.sizes) == 5_000
        receiver.accept(batch.deliveries)
        assert not receiver.take(6_000, None, 0).sizes
        _acknowledged(server, "drained", 5_000)
    finally:
        receiver.close([])


def test_a_stop_releases_what_spark_never_had_and_counts_what_it_did(
    server: RunningServer,
) -> None:
    """Of 6,000 messages the runner holds, those of an uncommitted batch come back counted."""
    published = _bodies(8_000)
    publish(server.url, "/queues/give-back", published)
    reader = _reader(server, "/queues/give-back", credit="6000")
    start = dict(INITIAL_OFFSET)
    end = _next_batch(reader, start, ReadMaxRows(1_000))
    _unacked(server, "give-back", 6_000)
    handed = set(_read(reader, start, end))
    reader.stop()
    stats = server.queue("give-back")
    assert (stats.ready, stats.unacked, stats.acknowledged) == (8_000, 0, 0)
    received = consume(server.url, "/queues/give-back", 8_000).messages
    counts = {_body(m): m.delivery_count for m in received}
    assert sorted(counts) == published
    assert {body for body, count in counts.items() if count > 0} == handed
    assert all(counts[body] == 1 for body in handed)


def test_sigterm_ends_the_process_again_once_the_reader_gave_back(server: RunningServer) -> None:
    """SIGTERM unwinds the runner while it holds messages, is ignored while it gives them back,
    and is the default again after: every process started later inherits it (the bench's
    prober once could not be stopped after the connector's tests had run in its parent)."""
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    publish(server.url, "/queues/sigterm", _bodies(10))
    reader = _reader(server, "/queues/sigterm")
    _next_batch(reader, dict(INITIAL_OFFSET), ReadAllAvailable())
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
    reader.stop()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_replayed_batch_of_a_dead_connection_is_empty(server: RunningServer) -> None:
    publish(server.url, "/queues/replay", _bodies(100))
    reader = _reader(server, "/queues/replay")
    try:
        _next_batch(reader, dict(INITIAL_OFFSET), ReadAllAvailable())
        stale: Offset = {"epoch": "0" * 32, "seq": 0}
        assert reader.partitions(stale, {"epoch": "0" * 32, "seq": 50}) == []
    finally:
        reader.stop()
