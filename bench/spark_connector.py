"""``python -m bench.spark_connector``: rows per second through the Spark connector.

Starts its own sluicegate (a separate process, so that its CPU and RSS are the server's alone)
and a local Spark (``local[2]``), then measures, for ``--count`` messages of about
``--body-size`` bytes of JSON with four application properties (the shape of issue 21's
orders):

0. two baselines without the connector, the ceilings the connector works under:
   ``spark alone``, Spark reading the same rows from a Python data source that hands it
   ready-made Arrow batches (two partitions, into ``noop``); and ``amqp alone``, two processes
   receiving the stream's two halves over AMQP without decoding them (the gateway's side);
1. the sink: a batch write of the rows in two partitions into a queue;
2. ``mode=queue``: a streaming read of the queue (``Trigger.AvailableNow``, micro-batches of
   ``maxRecordsPerTrigger`` rows) into Spark's ``noop`` sink;
3. ``mode=stream``: the same rows written to a stream queue, read as a batch in two partitions;
4. the same stream as a streaming read (``Trigger.AvailableNow``) in micro-batches of
   ``maxRecordsPerTrigger`` rows, then of as many bytes with ``maxBytesPerTrigger``.

Each streaming phase also prints its steady rate: the rows of every micro-batch but the first
(which starts the query and Spark's Python workers) over the time Spark spent on them.

It prints one line per phase: rows, seconds, rows/s, the server's CPU (percent of one core) and
peak RSS, and the load average before and after. Figures depend on the machine and its load: to
compare two versions, run them one after the other and compare each with the baselines of its
own run. Figures are for the notes, never for tests.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from bench.servers import Server, start_sluicegate, stop
from sluicegate.clients.quiver import procstat
from sluicegate.spark import register
from sluicegate.spark.records import SCHEMA, BatchBuilder

SAMPLE_PERIOD_S: Final = 0.25
# The queue is filled before it is read, and the gateway withholds credit from publishers once
# the messages it holds reach its memory budget: room for a million small messages and their
# bookkeeping (about 400 bytes each).
SERVER_OPTIONS: Final = ("--memory-budget", "2GiB")
MB: Final = 1024 * 1024
# Rows per micro-batch of the streaming phases.
BATCH_ROWS: Final = 100_000
# What a message the sink wrote carries around its body as the stream delivers it (header,
# QUERY:BATCH:PARTITION:ROW message-id, four properties, x-stream-offset), measured: the byte
# limit then makes batches about as large as the row limit, and the two phases compare.
ENVELOPE_BYTES: Final = 190
# Rows per ready-made batch of the Spark baseline.
BASELINE_BATCH: Final = 10_000
TICKS_PER_S: Final = procstat.TICKS_PER_S
# Hex digits in a SHA-256 digest: an order's note is made of as many as it needs.
SHA256_HEX: Final = 64
REGIONS: Final = ("eu", "us", "ap")


@contextmanager
def watched(pid: int) -> Iterator[Callable[[], tuple[float, float]]]:
    """Sample a process while the block runs; yields a function: (peak RSS MB, CPU seconds)."""
    peak = [0]
    first = procstat.sample(pid)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            reading = procstat.sample(pid)
            if reading is not None:
                peak[0] = max(peak[0], reading.rss_bytes)
            done.wait(SAMPLE_PERIOD_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()

    def result() -> tuple[float, float]:
        last = procstat.sample(pid)
        ticks = 0 if first is None or last is None else last.cpu_ticks - first.cpu_ticks
        return peak[0] / MB, ticks / TICKS_PER_S

    try:
        yield result
    finally:
        done.set()
        thread.join()


def report(phase: str, rows: int, seconds: float, server: tuple[float, float] | None) -> None:
    """One line per phase."""
    line = f"{phase:<44} {rows:>10,} rows {seconds:>7.1f} s {rows / seconds:>9,.0f} rows/s"
    if server is not None:
        rss, cpu = server
        line += f"  server CPU {100 * cpu / seconds:>4.0f} %  peak RSS {rss:,.0f} MB"
    print(line, flush=True)


def orders(spark: SparkSession, count: int, body_size: int) -> DataFrame:
    """``count`` JSON orders of about ``body_size`` bytes with four application properties.

    The note that pads an order to its size is hex digits that differ from row to row: a run of
    one letter would let mode=queue's compressed partitions (spark/queue_source.py) shrink far
    more than real messages do.
    """
    pad = max(0, body_size - 90)
    digests = [
        F.sha2((F.col("id") * SHA256_HEX + i).cast("string"), 256)
        for i in range(-(-pad // SHA256_HEX))
    ]
    note = F.substring(F.concat(F.lit(""), *digests), 1, pad)
    body = F.to_json(
        F.struct(
            F.col("id").alias("order"),
            F.concat(F.lit("customer-"), (F.col("id") % 1000).cast("string")).alias("customer"),
            (F.col("id") % 10_000 / 100).alias("amount"),
            note.alias("note"),
        )
    ).cast("binary")
    properties = F.create_map(
        F.lit("region"),
        F.element_at(
            F.array(F.lit("eu"), F.lit("us"), F.lit("ap")), (F.col("id") % 3 + 1).cast("int")
        ),
        F.lit("priority"),
        (F.col("id") % 5).cast("string"),
        F.lit("express"),
        (F.col("id") % 2 == 0).cast("string"),
        F.lit("amount"),
        (F.col("id") % 10_000 / 100).cast("string"),
    ).cast("map<string,string>")
    return spark.range(count, numPartitions=2).select(
        body.alias("body"), properties.alias("application_properties")
    )


def stream_into_noop(
    spark: SparkSession, pid: int, phase: str, expected: int, **options: str
) -> None:
    """One streaming phase: read with ``options`` until nothing is left (AvailableNow); says
    so if that was not the ``expected`` rows."""
    with (
        tempfile.TemporaryDirectory(prefix="spark-bench-") as scratch,
        watched(pid) as server,
    ):
        start = time.monotonic()
        query = (
            spark.readStream.format("sluicegate")
            .options(**options)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        batches = [p["numInputRows"] for p in progress]
        report(
            f"{phase} ({len(batches)} batches)", sum(batches), time.monotonic() - start, server()
        )
        if sum(batches) != expected:
            print(f"  read {sum(batches):,} rows, expected {expected:,}", flush=True)
        # Past the first batch, which also starts Spark's Python workers and the query: the rate
        # a long-running query keeps.
        later = progress[1:]
        if later:
            rows = sum(p["numInputRows"] for p in later)
            seconds = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
            report(f"  steady: batches 2-{len(progress)}", rows, seconds, None)


# -- the baselines ----------------------------------------------------------------------------


class _Ready(DataSourceReader):
    """Two partitions of the same ready-made record batch, repeated to ``rows`` rows."""

    def __init__(self, rows: int, sample: bytes) -> None:
        self.rows = rows
        self.sample = sample

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        builder = BatchBuilder()
        builder.add_numbered([self.sample] * BASELINE_BATCH, 0)
        batch = builder.finish()[0]
        for _ in range(self.rows // 2 // BASELINE_BATCH):
            yield batch


class ReadyBatches(DataSource):
    """``format("ready-batches")``: the Spark-alone baseline."""

    @classmethod
    def name(cls) -> str:
        return "ready-batches"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Ready(int(self.options["rows"]), bytes.fromhex(self.options["sample"]))


def _stream_link(url: str, address: str, offset: int) -> tuple[Any, Any]:
    """A connection and a settled receiver attached to the stream at ``offset``."""
    from sluicegate.spark.amqp import AmqpConnection
    from sluicegate.spark.options import parse_read_options
    from sluicegate.spark.stream_source import OFFSET_SPEC

    raw = {"url": url, "address": address, "mode": "stream"}
    amqp = AmqpConnection.open(parse_read_options(raw, streaming=False).endpoint)
    filters: dict[str, tuple[str, object]] = {OFFSET_SPEC: (OFFSET_SPEC, offset)}
    return amqp, amqp.receiver(address, settled=True, filters=filters, timeout=30)


def _receive_half(url: str, address: str, start: int, end: int, done: Any) -> None:
    """A process: receive ``[start, end)`` of the stream, count, decode nothing."""
    from sluicegate.clients.capi import lib, link_pointer, take_transfers

    amqp, link = _stream_link(url, address, start)
    impl = link_pointer(link)
    wanted = end - start
    link.flow(min(10_000, wanted))
    received = 0
    while received < wanted:
        _, payloads, _ = take_transfers(impl, wanted - received, settle=True)
        received += len(payloads)
        # Credit up to the half's end only: the count is of this half's messages alone.
        more = min(len(payloads), wanted - received - lib.pn_link_credit(impl))
        if more > 0:
            link.flow(more)
        if not payloads:
            amqp.pump(0.05)
    amqp.close()
    done.put(received)


def amqp_alone(url: str, address: str, count: int, pid: int) -> None:
    """Two processes, each receiving half of the stream without decoding it."""
    context = multiprocessing.get_context("spawn")
    done = context.Queue()
    halves = [(0, count // 2), (count // 2, count)]
    processes = [
        context.Process(target=_receive_half, args=(url, address, lo, hi, done))
        for lo, hi in halves
    ]
    with watched(pid) as server:
        start = time.monotonic()
        for process in processes:
            process.start()
        received = sum(done.get(timeout=600) for _ in processes)
        elapsed = time.monotonic() - start
        for process in processes:
            process.join()
        report("baseline: amqp alone, 2 receivers, no decode", received, elapsed, server())


def spark_alone(spark: SparkSession, count: int, sample: bytes) -> None:
    """Spark reading ready-made Arrow batches of the connector's schema into ``noop``."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    spark.dataSource.register(ReadyBatches)
    frame = spark.read.format("ready-batches").options(rows=str(count), sample=sample.hex()).load()
    frame.write.format("noop").mode("overwrite").save()  # warm the workers up
    start = time.monotonic()
    frame.write.format("noop").mode("overwrite").save()
    report("baseline: spark alone, ready Arrow, 2 parts", count, time.monotonic() - start, None)


def _sample_message(url: str, address: str) -> bytes:
    """One message of the stream, as the gateway delivers it."""
    amqp, link = _stream_link(url, address, 0)
    try:
        link.flow(1)
        amqp.wait(lambda: link.current is not None and not link.current.partial, 30, "a message")
        delivery = link.current
        assert delivery is not None
        return bytes(link.recv(delivery.pending) or b"")
    finally:
        amqp.close()


# -- the phases -------------------------------------------------------------------------------


def _declare_stream(url: str, name: str) -> str | None:
    declared = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluicegate",
            "queues",
            "--url",
            url,
            "declare",
            name,
            "--type",
            "stream",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if declared.returncode == 0 else declared.stderr.strip()


def run(server: Server, spark: SparkSession, count: int, body_size: int, baselines: bool) -> None:
    """Every phase against one server."""
    assert server.pid is not None
    url = f"amqp://{server.host}:{server.port}"
    rows = orders(spark, count, body_size)
    failure = _declare_stream(url, "spark-stream")
    if failure is not None:
        print(f"mode=stream: skipped, the server has no stream queues: {failure}")
    else:
        rows.write.format("sluicegate").option("url", url).option(
            "address", "/queues/spark-stream"
        ).mode("append").save()
        if baselines:
            spark_alone(spark, count, _sample_message(url, "/queues/spark-stream"))
            amqp_alone(url, "/queues/spark-stream", count, server.pid)

    with watched(server.pid) as watch:
        start = time.monotonic()
        rows.write.format("sluicegate").option("url", url).option(
            "address", "/queues/spark-bench"
        ).mode("append").save()
        report("sink: batch write, 2 partitions", count, time.monotonic() - start, watch())

    stream_into_noop(
        spark,
        server.pid,
        "mode=queue: streaming into noop",
        count,
        url=url,
        address="/queues/spark-bench",
        maxRecordsPerTrigger=str(BATCH_ROWS),
    )
    if failure is not None:
        return
    with watched(server.pid) as watch:
        start = time.monotonic()
        spark.read.format("sluicegate").option("url", url).option(
            "address", "/queues/spark-stream"
        ).option("mode", "stream").option("minPartitions", "2").load().write.format("noop").mode(
            "overwrite"
        ).save()
        report("mode=stream: batch read, 2 partitions", count, time.monotonic() - start, watch())
    max_bytes = str(BATCH_ROWS * (body_size + ENVELOPE_BYTES))
    for phase, limit, value in (
        ("mode=stream: streaming, maxRecords", "maxRecordsPerTrigger", str(BATCH_ROWS)),
        ("mode=stream: streaming, maxBytes", "maxBytesPerTrigger", max_bytes),
    ):
        stream_into_noop(
            spark,
            server.pid,
            phase,
            count,
            url=url,
            address="/queues/spark-stream",
            mode="stream",
            startingOffsets="earliest",
            minPartitions="2",
            **{limit: value},
        )


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    """Parse the arguments, start a server and Spark, run the phases."""
    parser = argparse.ArgumentParser(prog="python -m bench.spark_connector", description=__doc__)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument(
        "--no-baselines", action="store_true", help="skip the two connector-less baselines"
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-") as scratch:
        server = start_sluicegate("sluicegate", SERVER_OPTIONS, Path(scratch) / "data")
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.showConsoleProgress", "false")
            # Every micro-batch's progress, so that their row counts add up to the total.
            .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        where = (
            spark.sparkContext.parallelize([0], 1)
            .map(lambda _: __import__("sluicegate").__file__)
            .collect()[0]
        )
        print(json.dumps({"sluicegate": where, "load average": _load()}), flush=True)
        try:
            run(server, spark, args.count, args.body_size, not args.no_baselines)
        finally:
            print(json.dumps({"load average": _load()}), flush=True)
            spark.stop()
            stop(server)


if __name__ == "__main__":
    main()
