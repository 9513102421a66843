"""The sink, batch and streaming, checked by consuming what it wrote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from integration.connector.conftest import wait_for
from proton import Message
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import SparkSession
from support.clients import consume, publish

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]


def _body(message: Message) -> bytes:
    """A data-section body (proton hands it over as bytes or a memoryview)."""
    body = message.body
    assert isinstance(body, bytes | memoryview), body
    return bytes(body)


MESSAGE_ID = re.compile(r"^[0-9a-f]{32}:0:[01]:\d+$")


def test_a_batch_write_sends_every_row_once(spark: SparkSession, server: RunningServer) -> None:
    """Two partitions, properties set from columns, deterministic ids: consume them all back."""
    rows = [(f"row-{i:05d}".encode(), f"c{i}", {"n": str(i)}) for i in range(4_000)]
    frame = spark.createDataFrame(
        rows, "body binary, correlation_id string, application_properties map<string,string>"
    ).repartition(2)
    (
        frame.write.format("sluicegate")
        .option("url", server.url)
        .option("address", "/queues/spark-sink")
        .mode("append")
        .save()
    )
    assert server.queue("spark-sink").ready == 4_000
    received = consume(server.url, "/queues/spark-sink", 4_000).messages
    assert sorted(_body(m) for m in received) == sorted(body for body, _, _ in rows)
    for message in received:
        index = int(_body(message).decode().split("-")[1])
        assert message.correlation_id == f"c{index}"
        properties: object = message.properties  # proton declares the attribute as None
        assert properties == {"n": str(index)}
        assert MESSAGE_ID.match(str(message.id)), message.id
    assert len({m.id for m in received}) == 4_000
    assert server.queue("spark-sink").ready == 0


def test_a_streaming_pipeline_moves_a_queue_to_another(
    spark: SparkSession, server: RunningServer, tmp_path: Path
) -> None:
    """readStream (mode=queue) to writeStream: every message arrives once, ids per batch."""
    published = [f"pipe-{i:05d}".encode() for i in range(2_000)]
    publish(server.url, "/queues/spark-pipe-in", published)
    query = (
        spark.readStream.format("sluicegate")
        .option("url", server.url)
        .option("address", "/queues/spark-pipe-in")
        .option("maxRecordsPerTrigger", "500")
        .load()
        .select("body", "application_properties")
        .writeStream.format("sluicegate")
        .option("url", server.url)
        .option("address", "/queues/spark-pipe-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_for(query, lambda: server.queue("spark-pipe-in").acknowledged == 2_000)
    finally:
        query.stop()
    assert server.queue("spark-pipe-out").ready == 2_000
    received = consume(server.url, "/queues/spark-pipe-out", 2_000).messages
    assert sorted(_body(m) for m in received) == published
    ids = [str(m.id) for m in received]
    assert len(set(ids)) == 2_000
    assert all(i.startswith(f"{query.id}:") for i in ids)


def test_an_unknown_option_is_an_error_naming_it(
    spark: SparkSession, server: RunningServer
) -> None:
    """A misspelt option fails the query at once instead of being ignored."""
    with pytest.raises((AnalysisException, PySparkException), match=r"(?i)maxRecordPerTrigger"):
        (
            spark.readStream.format("sluicegate")
            .option("url", server.url)
            .option("address", "/queues/spark-typo")
            .option("maxRecordPerTrigger", "10")
            .load()
            .writeStream.format("noop")
            .start()
            .awaitTermination(60)
        )


def test_a_sink_refuses_an_unknown_column(spark: SparkSession, server: RunningServer) -> None:
    """Only the message's columns may be written; another column is named in the error."""
    frame = spark.createDataFrame([(b"x", 1)], "body binary, colour int")
    with pytest.raises((AnalysisException, PySparkException), match="colour"):
        (
            frame.write.format("sluicegate")
            .option("url", server.url)
            .option("address", "/queues/spark-colour")
            .mode("append")
            .save()
        )


def test_a_rejected_message_fails_the_write(spark: SparkSession, server: RunningServer) -> None:
    """A full queue with reject-publish: the task fails with the gateway's condition."""
    registry = server.server.registry
    server.call(
        lambda: registry.declare_queue(
            "spark-full", {"x-max-length": 10, "x-overflow": "reject-publish"}
        )
    )
    frame = spark.createDataFrame([(f"m{i}".encode(),) for i in range(50)], "body binary")
    with pytest.raises(PySparkException, match="rejected: amqp:resource-limit-exceeded"):
        (
            frame.coalesce(1)
            .write.format("sluicegate")
            .option("url", server.url)
            .option("address", "/queues/spark-full")
            .mode("append")
            .save()
        )
    assert server.queue("spark-full").ready == 10
