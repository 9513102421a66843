"""Reads take nothing they should not: the queue is looked up, and its type checked, first.

No Spark here: the readers are driven as Spark's planner, runner and tasks drive them.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable
from support.clients import consume, publish

from sluicegate.spark.amqp import AmqpConnection
from sluicegate.spark.browse import browse
from sluicegate.spark.options import ReadOptions, parse_read_options
from sluicegate.spark.queue_info import MissingQueue, WrongQueueType
from sluicegate.spark.queue_source import INITIAL_OFFSET, QueueStreamReader
from sluicegate.spark.records import COLUMNS
from sluicegate.spark.stream_source import DataLoss, OffsetRange, StreamRangeReader, read_range


def _options(server: RunningServer, address: str, *, streaming: bool, **extra: str) -> ReadOptions:
    raw = {"url": server.url, "address": address, **extra}
    options = parse_read_options(raw, streaming=streaming)
    return dataclasses.replace(options, min_partitions=2)


def _stream(server: RunningServer, name: str, count: int, **arguments: object) -> None:
    server.call(
        lambda: server.server.registry.declare_queue(name, {"x-queue-type": "stream", **arguments})
    )
    bodies = [f"{name}-{i:05d}".encode() for i in range(count)]
    if bodies:
        assert publish(server.url, f"/queues/{name}", bodies).outcomes == ["accepted"] * count


def test_mode_stream_on_a_classic_queue_takes_nothing(server: RunningServer) -> None:
    """The type is checked before any receiver attaches: 100 stay 100, never delivered."""
    publish(server.url, "/queues/classic-not-stream", [f"o{i}".encode() for i in range(100)])
    reader = StreamRangeReader(
        _options(server, "/queues/classic-not-stream", streaming=False, mode="stream")
    )
    for _ in range(3):
        with pytest.raises(
            WrongQueueType, match="'classic-not-stream' is a classic queue, not a stream"
        ):
            reader.partitions()
    stats = server.queue("classic-not-stream")
    assert (stats.ready, stats.delivered, stats.unacked) == (100, 0, 0)
    assert {
        m.delivery_count for m in consume(server.url, "/queues/classic-not-stream", 100).messages
    } == {0}


def test_browsing_a_stream_is_refused(server: RunningServer) -> None:
    _stream(server, "stream-not-browsed", 10)
    with pytest.raises(WrongQueueType, match="read it with mode=stream"):
        list(browse(_options(server, "/queues/stream-not-browsed", streaming=False), COLUMNS))


def _missing_reads(server: RunningServer, **extra: str) -> Iterator[Callable[[], object]]:
    yield lambda: StreamRangeReader(
        _options(server, "/queues/typo", streaming=False, mode="stream", **extra)
    ).partitions()
    yield lambda: list(browse(_options(server, "/queues/typo", streaming=False, **extra), COLUMNS))
    reader = QueueStreamReader(_options(server, "/queues/typo", streaming=True, **extra))
    yield lambda: reader.latestOffset(dict(INITIAL_OFFSET), ReadAllAvailable())


def test_a_missing_queue_is_an_error_naming_it_and_is_never_declared(
    server: RunningServer,
) -> None:
    for read in _missing_reads(server):
        with pytest.raises(MissingQueue, match="queue 'typo' does not exist"):
            read()
    assert server.call(lambda: server.server.registry.get("typo")) is None


def test_with_fail_on_missing_false_a_missing_queue_reads_as_empty(server: RunningServer) -> None:
    assert [read() for read in _missing_reads(server, failOnMissing="false")] == [
        [],
        [],
        dict(INITIAL_OFFSET),
    ]
    assert server.call(lambda: server.server.registry.get("typo")) is None


def test_an_empty_range_has_no_partitions_and_reads_nothing(server: RunningServer) -> None:
    _stream(server, "empty", 0)
    reader = StreamRangeReader(
        _options(server, "/queues/empty", streaming=False, mode="stream", startingOffsets="latest")
    )
    assert reader.partitions() == []
    assert list(reader.read(InputPartition(None))) == []


def test_offsets_retention_removed_fail_the_read_naming_them(server: RunningServer) -> None:
    _stream(server, "kept", 2_000, **{"x-max-length-bytes": 20_000})
    first = server.queue("kept").first_offset
    assert first is not None
    assert first > 0
    options = _options(server, "/queues/kept", streaming=False, mode="stream", startingOffsets="0")
    with pytest.raises(DataLoss, match=f"offsets 0 to {first - 1} are gone"):
        StreamRangeReader(options).partitions()
    with pytest.raises(DataLoss, match=f"offsets 0 to {first - 1} are gone"):
        list(read_range(options, COLUMNS, OffsetRange(0, 2_000)))
    lenient = dataclasses.replace(options, fail_on_data_loss=False)
    parts = StreamRangeReader(lenient).partitions()
    assert (parts[0].start, parts[-1].end) == (first, 2_000)
    rows = [
        offset
        for batch in read_range(lenient, COLUMNS, OffsetRange(0, 2_000))
        for offset in batch.column("offset").to_pylist()
    ]
    assert rows == list(range(first, 2_000))


def _hung_listener() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for sock in held:
            sock.close()
        listener.close()


@pytest.fixture
def hung_port() -> Iterator[int]:
    yield from _hung_listener()


def _refused_port() -> int:
    probe = socket.create_server(("127.0.0.1", 0))
    port: int = probe.getsockname()[1]
    probe.close()
    return port


@pytest.mark.parametrize("kind", ["refused", "hung"])
def test_a_connection_fails_within_timeout_times_attempts_naming_the_url(
    kind: str, hung_port: int
) -> None:
    port = hung_port if kind == "hung" else _refused_port()
    raw = {
        "url": f"amqp://127.0.0.1:{port}",
        "address": "/queues/q",
        "connectTimeoutMs": "400",
        "connectAttempts": "3",
    }
    options = parse_read_options(raw, streaming=False)
    started = time.monotonic()
    with pytest.raises(ConnectionError) as failed:
        AmqpConnection.open(options.endpoint)
    elapsed = time.monotonic() - started
    assert elapsed < 1.2 + 1.0  # 400 ms x 3, and a second of slack for a loaded machine
    message = str(failed.value)
    assert message.startswith(f"amqp://127.0.0.1:{port}: no connection after")
    cause = "refused" if kind == "refused" else "no AMQP OPEN from the gateway within"
    assert cause in message


def test_a_timestamp_start_finds_its_offset_without_taking_anything(
    server: RunningServer, tmp_path: Path
) -> None:
    _stream(server, "timed", 50)
    moment = time.time()
    time.sleep(0.01)
    bodies = [f"late-{i}".encode() for i in range(5)]
    publish(server.url, "/queues/timed", bodies)
    iso = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment))
        + f".{int(moment % 1 * 1000):03d}+00:00"
    )
    reader = StreamRangeReader(
        _options(server, "/queues/timed", streaming=False, mode="stream", startingOffsets=iso)
    )
    parts = reader.partitions()
    assert (parts[0].start, parts[-1].end) == (50, 55)
