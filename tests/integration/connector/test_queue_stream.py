"""``mode=queue`` streaming reads against a real gateway and a real local Spark."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from integration.connector.conftest import wait_for
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from support.clients import publish
from support.polling import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

# Generous: the machine running the suite may be shared and loaded.
DEADLINE_S = 240.0


def _bodies(count: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i:06d}".encode() for i in range(count)]


def _stream(spark: SparkSession, server: RunningServer, address: str, **options: str):  # type: ignore[no-untyped-def]
    reader = (
        spark.readStream.format("sluicegate").option("url", server.url).option("address", address)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _stop(query: StreamingQuery) -> None:
    query.stop()
    query.awaitTermination(60)


def test_a_streaming_query_receives_exactly_the_published_set(
    spark: SparkSession, server: RunningServer, tmp_path: Path
) -> None:
    """Every message once, in batches within maxRecordsPerTrigger, all settled by the end."""
    published = _bodies(5_000, "exact")
    assert publish(server.url, "/queues/spark-exact", published).outcomes == ["accepted"] * 5_000
    query = (
        _stream(spark, server, "/queues/spark-exact", maxRecordsPerTrigger="1000")
        .writeStream.format("memory")
        .queryName("spark_exact")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_for(query, lambda: server.queue("spark-exact").acknowledged == 5_000)
        rows = spark.sql("select body, delivery_count, offset from spark_exact").collect()
        progress = [p["numInputRows"] for p in query.recentProgress]
    finally:
        _stop(query)
    assert sorted(bytes(row.body) for row in rows) == published
    assert {row.delivery_count for row in rows} == {0}
    assert sorted(row.offset for row in rows) == list(range(1, 5_001))
    assert max(progress) <= 1_000
    assert sum(progress) == 5_000
    stats = server.queue("spark-exact")
    assert (stats.ready, stats.unacked) == (0, 0)


def _connection_pids(server: RunningServer) -> set[int]:
    """The pids in the container ids of the connector's connections (``sluicegate-spark-PID-…``)."""

    def read() -> set[int]:
        pids = set()
        for state in server.server.broker.connections:
            container = state.connection.remote_container or ""
            if container.startswith("sluicegate-spark-"):
                pids.add(int(container.split("-")[2]))
        return pids

    return server.call(read)


def test_a_killed_query_restarts_from_its_checkpoint_and_loses_nothing(
    spark: SparkSession, server: RunningServer, tmp_path: Path
) -> None:
    """SIGKILL the runner process mid-run; the restart gets the rest again, flagged."""
    published = _bodies(3_000, "kill")
    publish(server.url, "/queues/spark-kill", published)
    checkpoint, output = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def start() -> StreamingQuery:
        query: StreamingQuery = (
            _stream(spark, server, "/queues/spark-kill", maxRecordsPerTrigger="300")
            .writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        return query

    first = start()
    wait_for(first, lambda: server.queue("spark-kill").acknowledged >= 600)
    pids = _connection_pids(server)
    assert len(pids) == 1
    os.kill(pids.pop(), signal.SIGKILL)
    wait_until(lambda: not first.isActive, DEADLINE_S, 0.1)
    assert first.exception() is not None  # the query died with its runner
    wait_until(lambda: server.queue("spark-kill").unacked == 0, DEADLINE_S, 0.1)
    settled_before = server.queue("spark-kill").acknowledged
    assert settled_before < 3_000

    second = start()
    try:
        wait_for(second, lambda: server.queue("spark-kill").acknowledged == 3_000)
    finally:
        _stop(second)
    rows = spark.read.parquet(output).select("body", "delivery_count").collect()
    bodies = [bytes(row.body) for row in rows]
    assert set(bodies) == set(published)
    redelivered = [row for row in rows if row.delivery_count > 0]
    # The dead runner held every message it had not settled: all came back with count + 1.
    assert len(redelivered) == 3_000 - settled_before
    duplicates = {body for body in bodies if bodies.count(body) > 1}
    assert duplicates <= {bytes(row.body) for row in redelivered}


def test_available_now_reads_the_queue_until_empty_then_stops(
    spark: SparkSession, server: RunningServer, tmp_path: Path
) -> None:
    """More messages than the credit window: drained window after window, then the query ends."""
    published = _bodies(2_500, "now")
    publish(server.url, "/queues/spark-now", published)
    query = (
        _stream(spark, server, "/queues/spark-now", credit="1000", maxRecordsPerTrigger="400")
        .writeStream.format("memory")
        .queryName("spark_now")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240)
    assert query.exception() is None
    rows = spark.sql("select body from spark_now").collect()
    assert sorted(bytes(row.body) for row in rows) == published
    stats = server.queue("spark-now")
    assert (stats.ready, stats.unacked, stats.acknowledged) == (0, 0, 2_500)
