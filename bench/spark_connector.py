"""``python -m bench.spark_connector``: rows per second through the Spark connector.

Starts its own sluicegate (a separate process, so that its RSS is the server's alone) and a
local Spark (``local[2]``), then measures, for ``--count`` messages of ``--body-size`` bytes:

1. the sink: a batch write of that many rows in two partitions into a queue;
2. ``mode=queue``: a streaming read of the queue (``Trigger.AvailableNow``) into Spark's
   ``noop`` sink, the driver-held receiver settling batch after batch;
3. ``mode=stream`` when the server serves stream queues: a stream of that many messages (written
   by the sink) read into ``noop`` with two partitions (``minPartitions=2``);
4. the same stream as a streaming read (``Trigger.AvailableNow``) in micro-batches of
   ``maxRecordsPerTrigger`` rows, then of as many bytes with ``maxBytesPerTrigger``: the
   difference is the cost of the runner reading message sizes ahead (docs/spark.md).

It prints one line per phase: rows, seconds, rows/s, and the server's peak RSS during it.
Figures depend on the machine and its load; they are for the notes, never for tests.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.servers import Server, start_sluicegate, stop
from sluicegate.clients.quiver import procstat
from sluicegate.spark import register

SAMPLE_PERIOD_S: Final = 0.25
# The queue is filled before it is read, and the gateway withholds credit from publishers once
# the messages it holds reach its memory budget: room for a million small messages and their
# bookkeeping (about 400 bytes each).
SERVER_OPTIONS: Final = ("--memory-budget", "2GiB")
MB: Final = 1024 * 1024
# Rows per micro-batch of the streaming phases.
BATCH_ROWS: Final = 100_000
# What a message the sink wrote carries around its body as the stream delivers it (the
# QUERY:BATCH:PARTITION:ROW message-id and the x-stream-offset annotation): 92 bytes measured,
# so that the byte limit makes batches as large as the row limit and the two phases compare.
ENVELOPE_BYTES: Final = 92


@contextmanager
def peak_rss(pid: int) -> Iterator[Callable[[], float]]:
    """Sample a process's RSS while the block runs; yields a function returning the peak (MB)."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            reading = procstat.sample(pid)
            if reading is not None:
                peak[0] = max(peak[0], reading.rss_bytes)
            done.wait(SAMPLE_PERIOD_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: peak[0] / MB
    finally:
        done.set()
        thread.join()


def report(phase: str, rows: int, seconds: float, rss_mb: float) -> None:
    """One line per phase."""
    print(
        f"{phase:<40} {rows:>10,} rows {seconds:>8.1f} s {rows / seconds:>10,.0f} rows/s "
        f"server peak RSS {rss_mb:,.0f} MB",
        flush=True,
    )


def stream_into_noop(spark: SparkSession, pid: int, phase: str, **options: str) -> None:
    """One streaming phase: read with ``options`` until nothing is left (AvailableNow)."""
    with (
        tempfile.TemporaryDirectory(prefix="spark-bench-") as scratch,
        peak_rss(pid) as peak,
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
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        phase = f"{phase} ({len(batches)} batches)"
        report(phase, sum(batches), time.monotonic() - start, peak())


def run(server: Server, spark: SparkSession, count: int, body_size: int) -> None:
    """The three phases against one server."""
    assert server.pid is not None
    url = f"amqp://{server.host}:{server.port}"
    body = b"x" * body_size
    rows = spark.range(count, numPartitions=2).select(F.lit(body).alias("body"))
    with peak_rss(server.pid) as peak:
        start = time.monotonic()
        rows.write.format("sluicegate").option("url", url).option(
            "address", "/queues/spark-bench"
        ).mode("append").save()
        report("sink: batch write, 2 partitions", count, time.monotonic() - start, peak())

    stream_into_noop(
        spark,
        server.pid,
        "mode=queue: streaming read into noop",
        url=url,
        address="/queues/spark-bench",
        maxRecordsPerTrigger="100000",
    )

    declared = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluicegate",
            "queues",
            "--url",
            url,
            "declare",
            "spark-stream",
            "--type",
            "stream",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if declared.returncode != 0:
        print(f"mode=stream: skipped, the server has no stream queues: {declared.stderr.strip()}")
        return
    rows.write.format("sluicegate").option("url", url).option(
        "address", "/queues/spark-stream"
    ).mode("append").save()
    with peak_rss(server.pid) as peak:
        start = time.monotonic()
        spark.read.format("sluicegate").option("url", url).option(
            "address", "/queues/spark-stream"
        ).option("mode", "stream").option("minPartitions", "2").load().write.format("noop").mode(
            "overwrite"
        ).save()
        report(
            "mode=stream: batch read, 2 partitions, noop", count, time.monotonic() - start, peak()
        )
    max_bytes = str(BATCH_ROWS * (body_size + ENVELOPE_BYTES))
    for phase, limit, value in (
        ("mode=stream: streaming, maxRecords", "maxRecordsPerTrigger", str(BATCH_ROWS)),
        ("mode=stream: streaming, maxBytes", "maxBytesPerTrigger", max_bytes),
    ):
        stream_into_noop(
            spark,
            server.pid,
            phase,
            url=url,
            address="/queues/spark-stream",
            mode="stream",
            startingOffsets="earliest",
            minPartitions="2",
            **{limit: value},
        )


def main() -> None:
    """Parse the arguments, start a server and Spark, run the phases."""
    parser = argparse.ArgumentParser(prog="python -m bench.spark_connector", description=__doc__)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--body-size", type=int, default=100)
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
        try:
            run(server, spark, args.count, args.body_size)
        finally:
            spark.stop()
            stop(server)


if __name__ == "__main__":
    main()
