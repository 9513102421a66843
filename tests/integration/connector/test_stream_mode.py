"""``mode=stream``: offset ranges of a stream queue, batch and Trigger.AvailableNow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.readwriter import DataFrameReader
from pyspark.sql.streaming.readwriter import DataStreamReader
from support.clients import publish

from sluicegate.spark.amqp import AmqpConnection
from sluicegate.spark.options import parse_read_options
from sluicegate.spark.stream_source import OFFSET_SPEC

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]


def _events(
    reader: DataFrameReader | DataStreamReader, running: RunningServer, **options: str
) -> DataFrame:
    """The stream queue ``events`` read by offset, with ``options``."""
    source = reader.format("sluicegate").options(url=running.url, address="/queues/events")
    return source.options(mode="stream", **options).load()


def _stream_queue(
    make_server: Callable[..., RunningServer], tmp_path: Path, count: int
) -> RunningServer:
    """A server with a stream queue ``events`` holding ``count`` messages at offsets 0…count-1."""
    running = make_server(data_dir=tmp_path / "data")
    running.call(
        lambda: running.server.registry.declare_queue("events", {"x-queue-type": "stream"})
    )
    bodies = [f"event-{i:05d}".encode() for i in range(count)]
    assert publish(running.url, "/queues/events", bodies).outcomes == ["accepted"] * count
    return running


def test_a_batch_read_in_two_partitions_reads_exactly_the_range(
    spark: SparkSession, make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """[200, 700) in two tasks: every offset once, none outside, the stream unchanged."""
    running = _stream_queue(make_server, tmp_path, 1_000)
    frame = _events(
        spark.read, running, startingOffsets="200", endingOffsets="700", minPartitions="2"
    )
    assert frame.rdd.getNumPartitions() == 2
    rows = frame.select("offset", "body").orderBy("offset").collect()
    assert [row.offset for row in rows] == list(range(200, 700))
    assert [bytes(row.body) for row in rows] == [f"event-{i:05d}".encode() for i in range(200, 700)]
    everything = _events(spark.read, running, minPartitions="2")
    assert everything.count() == 1_000


def test_a_streaming_read_with_available_now_reads_the_stream_once(
    spark: SparkSession, make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """earliest to the tail in micro-batches of at most 300, two tasks each, then it stops."""
    running = _stream_queue(make_server, tmp_path, 1_000)
    query = (
        _events(
            spark.readStream,
            running,
            startingOffsets="earliest",
            maxRecordsPerTrigger="300",
            minPartitions="2",
        )
        .writeStream.format("memory")
        .queryName("spark_stream_mode")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240)
    assert query.exception() is None
    offsets = [row.offset for row in spark.sql("select offset from spark_stream_mode").collect()]
    assert sorted(offsets) == list(range(1_000))
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]


def _encoded_sizes(url: str, count: int) -> list[int]:
    """The size of each message of ``events`` as the gateway delivers it, read over AMQP."""
    options = parse_read_options(
        {"url": url, "address": "/queues/events", "mode": "stream"}, streaming=False
    )
    amqp = AmqpConnection.open(options.endpoint)
    try:
        link = amqp.receiver(
            "/queues/events", settled=True, filters={OFFSET_SPEC: (OFFSET_SPEC, 0)}, timeout=30
        )
        link.flow(count)
        sizes: list[int] = []
        while len(sizes) < count:
            amqp.wait(
                lambda: link.current is not None and not link.current.partial, 30, "a message"
            )
            delivery = link.current
            assert delivery is not None
            sizes.append(len(link.recv(delivery.pending) or b""))
            link.advance()
            delivery.settle()
        return sizes
    finally:
        amqp.close()


def _greedy_batches(sizes: list[int], max_bytes: int) -> list[int]:
    """Rows per batch: the longest run within ``max_bytes``, or one message larger than it."""
    batches: list[int] = []
    position = 0
    while position < len(sizes):
        end, total = position, 0
        while end < len(sizes) and (end == position or total + sizes[end] <= max_bytes):
            total += sizes[end]
            end += 1
        batches.append(end - position)
        position = end
    return batches


def test_max_bytes_per_trigger_plans_batches_by_the_sizes_of_the_messages(
    spark: SparkSession, make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Messages of varied sizes and one larger than the limit, under Trigger.AvailableNow."""
    running = make_server(data_dir=tmp_path / "data")
    running.call(
        lambda: running.server.registry.declare_queue("events", {"x-queue-type": "stream"})
    )
    bodies = [b"x" * (9_000 if i == 150 else 20 + (i * 53) % 500) for i in range(300)]
    assert publish(running.url, "/queues/events", bodies).outcomes == ["accepted"] * 300
    max_bytes = 8_000
    expected = _greedy_batches(_encoded_sizes(running.url, 300), max_bytes)
    assert 1 in expected  # the 9,000-byte message travels alone
    query = (
        _events(
            spark.readStream,
            running,
            startingOffsets="earliest",
            maxBytesPerTrigger=str(max_bytes),
            minPartitions="2",
        )
        .writeStream.format("memory")
        .queryName("spark_stream_bytes")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240)
    assert query.exception() is None
    rows = spark.sql("select offset, body from spark_stream_bytes").collect()
    assert sorted(row.offset for row in rows) == list(range(300))
    assert sorted(bytes(row.body) for row in rows) == sorted(bodies)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == expected
