"""``mode=queue``: a streaming read that consumes a queue at-least-once, decoded by the executors.

The deliveries can only be settled on the link they arrived on, so the query's one long-lived
streaming runner process (Spark's driver side, docs/spark.md) holds the link
(``spark.queue_receiver``). Its messages reach the executors as they arrived, still encoded: when
Spark plans a micro-batch (``latestOffset``) the runner takes what the receiver has buffered, within
``maxRecordsPerTrigger`` and ``maxBytesPerTrigger``; ``partitions`` hands those bytes, compressed,
to ``minPartitions`` tasks, which decode them in parallel; ``commit`` settles them ``accepted``.

Spark plans the batch after one only once that one is in its commit log (sequential micro-batch
execution, docs/spark.md), so ``latestOffset(start)`` also settles everything up to ``start``;
``commit(end)`` comes one batch late and never for the last batch before a stop. Spark's
asynchronous progress tracking, which plans before committing, would break this and is not
supported.

Offsets are ``{"epoch": E, "seq": N}``: ``E`` names the connection, ``N`` counts the messages handed
to Spark on it. A batch Spark replays after a restart belongs to a dead connection: its messages
went back to the queue and come again as new deliveries, so the replay is empty.

On ``stop`` the runner gives back what it holds (``spark.queue_receiver``): messages never handed to
a batch are ``released`` and keep their delivery-count, those of a batch not committed come back
with it raised. So ``delivery_count > 0`` (``redelivered``) marks a message some consumer may
already have processed, and a query that is stopped and started again sees none.
"""

from __future__ import annotations

import signal
import struct
import sys
import threading
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from sluicegate.spark.amqp import AmqpConnection
from sluicegate.spark.options import ReadOptions
from sluicegate.spark.queue_info import look_up
from sluicegate.spark.queue_receiver import Batch, QueueReceiver
from sluicegate.spark.records import BATCH_ROWS, BatchBuilder, read_columns

# The offset of a query that has read nothing yet: no connection has an empty epoch.
INITIAL_OFFSET: Final[dict[str, Any]] = {"epoch": "", "seq": 0}


# A batch's messages reach the tasks compressed: Spark pickles the partitions to its JVM, which
# holds them and copies them on to the tasks' workers, and bytes cost the JVM CPU at every step
# (about 1 s per 100 MB, measured). zstd's fastest level costs far less: the benchmark's
# messages (JSON orders padded with hex) shrink 4.2 times, 13.7 MB in 30 ms of CPU, and a task
# restores them in 9 ms; a text that repeats more shrinks more (50 times for a run of one letter).
CODEC: Final = "zstd"
CODEC_LEVEL: Final = 1


def _codec() -> pa.Codec:
    return pa.Codec(CODEC, CODEC_LEVEL)


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Encoded messages for one task, compressed (``CODEC``): ``first`` is the seq of the
    first; ``sizes``, ``count`` little-endian u32s, one per message, cut ``payloads``, ``length``
    bytes, apart."""

    first: int
    count: int
    sizes: bytes
    length: int
    payloads: bytes

    @classmethod
    def pack(cls, first: int, sizes: array[int], payloads: bytes | memoryview) -> QueuePartition:
        """The partition of the messages ``payloads`` holds back to back, ``sizes`` bytes each."""
        if sys.byteorder == "big":
            sizes = array(sizes.typecode, sizes)
            sizes.byteswap()
        codec = _codec()
        packed = codec.compress(sizes, asbytes=True)
        return cls(first, len(sizes), packed, len(payloads), codec.compress(payloads, asbytes=True))


@dataclass
class _Planned:
    """A batch handed to Spark and not yet committed: its seqs and what it holds."""

    first: int
    end: int
    batch: Batch


def _partitions(planned: _Planned, parts: int) -> list[QueuePartition]:
    """A planned batch in at most ``parts`` nearly equal, contiguous slices."""
    sizes, data = planned.batch.sizes, memoryview(planned.batch.data)
    count = len(sizes)
    parts = max(1, min(parts, count))
    bounds = [count * i // parts for i in range(parts + 1)]
    result = []
    start = 0
    for lo, hi in pairwise(bounds):
        chunk = sizes[lo:hi]
        end = start + sum(chunk)
        result.append(QueuePartition.pack(planned.first + lo, chunk, data[start:end]))
        start = end
    return result


# Whether _ignore_sigterm replaced the reader's own handler with SIG_IGN (a process-wide setting,
# so module-wide state): only then does _default_sigterm put the default back.
_sigterm_ignored = False


def _leave_on_sigterm() -> None:
    """Have SIGTERM unwind the runner's main loop, so that its ``finally`` calls ``stop``.

    Spark ends a query's streaming runner with SIGTERM (``Process.destroy``), whose default
    ends a Python process at once: the connection would drop and the gateway would count every
    held message as possibly delivered. As an exception, the signal lets :meth:`stop` give
    them back first. Installed once, from the runner's main thread, over the default only.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum: int, frame: object) -> None:
    _ignore_sigterm()
    raise SystemExit(128 + signum)


def _ignore_sigterm() -> None:
    """Let a give-back finish (it is bounded): Spark signals again while the runner stops, and
    may signal first while a ``stop`` that the closed socket started is under way."""
    global _sigterm_ignored
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) is _terminated
    ):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _sigterm_ignored = True


def _default_sigterm() -> None:
    """After the give-back, SIGTERM ends the process at once again, as before the reader.

    An ignored SIGTERM would outlive the reader in a process that goes on (a reused worker, an
    application reading in process), and every process it starts afterwards would inherit it
    ignored and could not be stopped politely.
    """
    global _sigterm_ignored
    if (
        _sigterm_ignored
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    ):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _sigterm_ignored = False


def decode_partition(
    partition: QueuePartition, columns: tuple[str, ...]
) -> Iterator[pa.RecordBatch]:
    """A task's messages as record batches, each yielded as soon as it is cut, so that Spark
    takes one while the next is decoded; a row's ``offset`` is its seq."""
    builder = BatchBuilder(columns)
    codec = _codec()
    payloads = codec.decompress(partition.payloads, partition.length, asbytes=True)
    packed = codec.decompress(partition.sizes, 4 * partition.count, asbytes=True)
    sizes = struct.unpack(f"<{partition.count}I", packed)
    bounds = list(accumulate(sizes, initial=0))
    for row in range(0, len(sizes), BATCH_ROWS):
        edges = bounds[row : row + BATCH_ROWS + 1]
        builder.add_numbered(
            (payloads[start:end] for start, end in pairwise(edges)), partition.first + row
        )
        yield from builder.full_batches()
    yield from builder.finish()


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Consumes a queue through one receiver held by the streaming runner.

    Constructed in planner processes too and pickled, so it connects on first use only.
    """

    def __init__(self, options: ReadOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema
        self.columns = read_columns(schema)
        self._receiver: QueueReceiver | None = None
        self._seq = 0
        self._planned: deque[_Planned] = deque()
        self._available_now = False

    def __reduce__(
        self,
    ) -> tuple[type[QueueStreamReader], tuple[ReadOptions, StructType | None]]:
        """Only the options travel: a connection belongs to the process that opened it."""
        return (QueueStreamReader, (self.options, self.schema))

    def initialOffset(self) -> dict[str, Any]:
        """Nothing read yet (Spark ignores this on a restart and uses its checkpoint)."""
        return dict(INITIAL_OFFSET)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerTrigger`` or ``maxBytesPerTrigger`` as Spark's admission control."""
        rows = self.options.max_records_per_trigger
        if rows is not None:
            return ReadMaxRows(rows)
        max_bytes = self.options.max_bytes_per_trigger
        return ReadAllAvailable() if max_bytes is None else ReadMaxBytes(max_bytes)

    def _connected(self) -> QueueReceiver | None:
        """The live receiver; None while the queue is missing (``failOnMissing=false``)."""
        receiver = self._receiver
        if receiver is not None and receiver.failure is not None:
            # What it held went back to the gateway and will be delivered again.
            receiver.close([])
            self._planned.clear()
            receiver = self._receiver = None
        if receiver is None:
            endpoint = self.options.endpoint
            amqp = AmqpConnection.open(endpoint)
            try:
                if look_up(amqp, self.options) is None:
                    return None
            finally:
                amqp.close()
            _leave_on_sigterm()
            receiver = QueueReceiver(endpoint, self.options.credit)
            self._receiver = receiver
            self._seq = 0
            if self._available_now:
                receiver.drain()
        return receiver

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Settle what Spark committed, then take what has arrived as the next batch."""
        receiver = self._connected()
        if receiver is None:
            return start
        if start.get("epoch") == receiver.epoch:
            self._settle(receiver, int(start["seq"]))
        rows, max_bytes = self.options.max_records_per_trigger, self.options.max_bytes_per_trigger
        if isinstance(limit, ReadAllAvailable):
            rows = max_bytes = None
        elif isinstance(limit, ReadMaxRows):
            rows = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        batch = receiver.take(rows, max_bytes, self.options.receive_timeout_s)
        if not batch.sizes:
            return start
        first = self._seq + 1
        self._seq += len(batch.sizes)
        self._planned.append(_Planned(first, self._seq, batch))
        return {"epoch": receiver.epoch, "seq": self._seq}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueuePartition]:
        """The batch's messages, still encoded, for ``minPartitions`` tasks to decode."""
        receiver = self._receiver
        if receiver is None or end.get("epoch") != receiver.epoch:
            return []  # a replay after a restart: its messages are back with the gateway
        seq = int(end["seq"])
        assert self.options.min_partitions is not None
        for planned in self._planned:
            if planned.end == seq:
                return _partitions(planned, self.options.min_partitions)
        return []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Decode one slice of a batch, in an executor."""
        if not isinstance(partition, QueuePartition):
            return iter(())
        return decode_partition(partition, self.columns)

    def commit(self, end: dict[str, Any]) -> None:
        """Settle ``accepted`` every message of the batches up to ``end`` (if not yet done)."""
        receiver = self._receiver
        if receiver is not None and end.get("epoch") == receiver.epoch:
            self._settle(receiver, int(end["seq"]))

    def _settle(self, receiver: QueueReceiver, last: int) -> None:
        settled: list[Any] = []
        planned = self._planned
        while planned and planned[0].end <= last:
            settled.extend(planned.popleft().batch.deliveries)
        receiver.accept(settled)

    def prepareForTriggerAvailableNow(self) -> None:
        """Drain the queue: the query ends once it has read what arrived before a drain found
        the queue empty (``QueueReceiver.take``).

        A queue has no offsets to stop at, so what a producer publishes while the query runs
        is read too, until then; a producer faster than the query keeps it running.
        """
        self._available_now = True
        if self._receiver is not None:
            self._receiver.drain()

    def stop(self) -> None:
        """Give back what was not committed (see the module docstring) and close."""
        if self._receiver is not None:
            _ignore_sigterm()
            handed = [
                delivery for planned in self._planned for delivery in planned.batch.deliveries
            ]
            self._planned.clear()
            try:
                self._receiver.close(handed)
            finally:
                self._receiver = None
                _default_sigterm()
