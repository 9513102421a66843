"""``mode=stream``: offset ranges of a stream queue, batch and Trigger.AvailableNow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from pyspark.sql import SparkSession
from support.clients import publish

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


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
    frame = (
        spark.read.format("sluicegate")
        .option("url", running.url)
        .option("address", "/queues/events")
        .option("mode", "stream")
        .option("startingOffsets", "200")
        .option("endingOffsets", "700")
        .option("minPartitions", "2")
        .load()
    )
    assert frame.rdd.getNumPartitions() == 2
    rows = frame.select("offset", "body").orderBy("offset").collect()
    assert [row.offset for row in rows] == list(range(200, 700))
    assert [bytes(row.body) for row in rows] == [f"event-{i:05d}".encode() for i in range(200, 700)]
    everything = (
        spark.read.format("sluicegate")
        .option("url", running.url)
        .option("address", "/queues/events")
        .option("mode", "stream")
        .option("minPartitions", "2")
        .load()
    )
    assert everything.count() == 1_000


def test_a_streaming_read_with_available_now_reads_the_stream_once(
    spark: SparkSession, make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """earliest to the tail in micro-batches of at most 300, two tasks each, then it stops."""
    running = _stream_queue(make_server, tmp_path, 1_000)
    query = (
        spark.readStream.format("sluicegate")
        .option("url", running.url)
        .option("address", "/queues/events")
        .option("mode", "stream")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "300")
        .option("minPartitions", "2")
        .load()
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
