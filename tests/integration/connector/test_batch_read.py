"""Batch reads: a browse copies a queue and leaves it as it was."""

from __future__ import annotations

import pytest
from integration.conftest import RunningServer
from proton import Message
from pyspark.sql import SparkSession
from support.clients import consume, publish

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]


def test_a_browse_reads_every_message_and_leaves_the_queue_unchanged(
    spark: SparkSession, server: RunningServer
) -> None:
    """More messages than one drain window (a full one, then part of one), with properties; the
    queue still has them all."""
    messages = [
        Message(
            body=f"browse-{i:05d}".encode(),
            id=f"id-{i}",
            subject="orders",
            properties={"n": i},
            inferred=True,
        )
        for i in range(12_000)
    ]
    publish(server.url, "/queues/spark-browse", messages=messages)
    before = server.queue("spark-browse")

    frame = (
        spark.read.format("sluicegate")
        .option("url", server.url)
        .option("address", "/queues/spark-browse")
        .load()
    )
    rows = frame.orderBy("offset").collect()

    assert [bytes(row.body) for row in rows] == [m.body for m in messages]
    assert [row.offset for row in rows] == list(range(1, 12_001))
    assert rows[7].message_id == "id-7"
    assert rows[7].subject == "orders"
    assert rows[7].application_properties == {"n": "7"}
    assert {row.delivery_count for row in rows} == {0}
    after = server.queue("spark-browse")
    assert (after.ready, after.unacked, after.acknowledged) == (
        before.ready,
        before.unacked,
        before.acknowledged,
    )
    assert after.ready == 12_000
    received = consume(server.url, "/queues/spark-browse", 12_000).messages
    assert len(received) == 12_000


def test_a_destructive_batch_read_is_refused(spark: SparkSession, server: RunningServer) -> None:
    """mode=queue has no commit to settle on in a batch read."""
    with pytest.raises(Exception, match="mode=browse"):
        (
            spark.read.format("sluicegate")
            .option("url", server.url)
            .option("address", "/queues/spark-refused")
            .option("mode", "queue")
            .load()
            .collect()
        )
