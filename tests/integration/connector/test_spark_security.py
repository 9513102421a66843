"""Spark against a gateway that wants a password over TLS: reads, writes, and a refused login."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from integration.connector.conftest import wait_for
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import SparkSession
from support.certificates import self_signed

from sluicegate.gateway.rules.auth import User, hash_password, parse_users

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

PASSWORD = "Spark-s3cret-pw"


@functools.cache
def _users() -> dict[str, User]:
    return parse_users({"etl": {"password_hash": hash_password(PASSWORD)}})


@pytest.fixture
def secured(make_server: Callable[..., RunningServer], tmp_path: Path) -> tuple[str, Path]:
    """An amqps:// gateway without anonymous logins: its URL and the CA file that trusts it."""
    cert, key = self_signed(tmp_path, "localhost", "DNS:localhost,IP:127.0.0.1")
    running = make_server(
        users=_users(),
        anonymous_login="off",
        tls_cert_file=cert,
        tls_key_file=key,
        tls_listen="127.0.0.1:0",
    )
    return f"amqps://127.0.0.1:{running.server.tls_port}", cert


def _login(url: str, ca: Path, password: str = PASSWORD) -> dict[str, str]:
    return {"url": url, "username": "etl", "password": password, "tlsCaFile": str(ca)}


def test_write_then_stream_a_queue_over_tls_with_a_password(
    spark: SparkSession, secured: tuple[str, Path], tmp_path: Path
) -> None:
    """The sink's tasks and the streaming runner both log in; Spark's plan hides the password."""
    url, ca = secured
    bodies = [f"order-{n:05d}" for n in range(2_000)]
    (
        spark.createDataFrame([(body,) for body in bodies], "body string")
        .repartition(2)
        .write.format("sluicegate")
        .options(**_login(url, ca), address="/queues/orders")
        .mode("append")
        .save()
    )
    frame = (
        spark.readStream.format("sluicegate")
        .options(**_login(url, ca), address="/queues/orders", maxRecordsPerTrigger="700")
        .load()
    )
    plan = frame._jdf.queryExecution().toString()
    assert PASSWORD not in plan
    query = (
        frame.writeStream.format("memory")
        .queryName("spark_secured")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_for(query, lambda: spark.sql("select * from spark_secured").count() == 2_000)
        rows = spark.sql("select body from spark_secured").collect()
    finally:
        query.stop()
        query.awaitTermination(60)
    assert sorted(bytes(row.body).decode() for row in rows) == bodies


def test_a_wrong_password_fails_the_query_naming_the_condition(
    spark: SparkSession, secured: tuple[str, Path], tmp_path: Path
) -> None:
    url, ca = secured
    wrong = "not-the-" + PASSWORD
    query = (
        spark.readStream.format("sluicegate")
        .options(**_login(url, ca, wrong), address="/queues/orders")
        .load()
        .writeStream.format("memory")
        .queryName("spark_refused")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        # It fails at once: a refused login is not retried (awaitTermination would say False).
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(240)
    finally:
        query.stop()
    error = str(failed.value)
    assert "amqp:unauthorized-access" in error
    assert "'etl'" in error
    assert wrong not in error
    with pytest.raises(PySparkException) as refused:
        (
            spark.read.format("sluicegate")
            .options(**_login(url, ca, wrong), address="/queues/orders")
            .load()
            .collect()
        )
    assert "amqp:unauthorized-access" in str(refused.value)
    assert wrong not in str(refused.value)
