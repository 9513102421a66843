"""``mode=stream``: fixed offset ranges of a stream queue, batch and streaming, replayable.

A stream queue keeps its messages after they are read and numbers them (``x-stream-offset`` in
each message's annotations). A Spark offset here is ``{"offset": N}``, the next stream offset
to read; a micro-batch or a batch read is the range ``[start, end)``, split into
``minPartitions`` tasks. Each task attaches with the ``rabbitmq:stream-offset-spec`` filter set
to its first offset and stops at its end, so a replayed range reads the same messages again:
exactly-once with an idempotent sink.

Where the stream starts and ends comes from the gateway's management API
(``spark.queue_info``), which also says whether the queue is a stream before anything is read.
A timestamp is found by a receiver attached at it, unsettled, whose one message is released.

Retention may remove offsets before they are read. With ``failOnDataLoss`` (the default, as in
Spark's Kafka source) a range that starts below the stream's first offset, or a task that finds
offsets missing, fails the query naming the offsets; otherwise it logs a warning and reads what
is left.

``maxBytesPerTrigger`` needs the sizes of the messages before their batch is planned: the gateway
sums them where it keeps them and tells where the batch ends (``spark.queue_info.batch_end``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from proton import Delivery, Receiver, timestamp
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from sluicegate.clients.capi import has_transfer, link_pointer, take_transfers, unused_credit
from sluicegate.spark.amqp import POLL_S, AmqpConnection, AmqpError
from sluicegate.spark.options import OffsetKind, OffsetSpec, ReadOptions
from sluicegate.spark.queue_info import QueueInfo, batch_end, look_up, queue_name
from sluicegate.spark.records import (
    BATCH_ROWS,
    STREAM_OFFSET_ANNOTATION,
    BatchBuilder,
    read_columns,
)
from sluicegate.wire.annotations import read_stream_offset

log = logging.getLogger("sluicegate.spark")

OFFSET_SPEC: Final = "rabbitmq:stream-offset-spec"
# Credit a range read keeps outstanding: one record batch's worth, topped up at half, so the
# gateway always has credit while the task decodes.
RANGE_WINDOW: Final = BATCH_ROWS
# A range read that has waited this long for its next message asks the gateway (a drain)
# whether the stream has anything more, rather than waiting out receiveTimeoutMs.
QUIET_S: Final = 1.0


class DataLoss(AmqpError):
    """Offsets a read needs are gone from the stream (retention), and ``failOnDataLoss`` is set."""


def _not_a_stream(options: ReadOptions) -> AmqpError:
    return AmqpError(
        f"{options.endpoint.address}: not a stream queue "
        f"(a message without {STREAM_OFFSET_ANNOTATION})"
    )


def _attach(amqp: AmqpConnection, options: ReadOptions, spec: object, *, settled: bool) -> Receiver:
    endpoint = options.endpoint
    return amqp.receiver(
        endpoint.address,
        settled=settled,
        filters={OFFSET_SPEC: (OFFSET_SPEC, spec)},
        timeout=endpoint.connect_timeout_s,
    )


def _lost(options: ReadOptions, where: str, wanted: int, first: int) -> None:
    """Offsets ``wanted`` to ``first - 1`` are gone: fail, or warn and go on (``failOnDataLoss``).

    ``first`` is the next offset the stream still holds (or the range's end).
    """
    message = (
        f"{where}: offsets {wanted} to {first - 1} are gone (retention removed them before "
        f"they were read; the next offset the stream holds is {first})"
    )
    if options.fail_on_data_loss:
        raise DataLoss(f"{message}; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


def probe_timestamp(amqp: AmqpConnection, options: ReadOptions, moment: int) -> int | None:
    """The offset of the first message at or after ``moment`` (ms); None if there is none.

    The receiver is unsettled and its one message released, so even a queue that stopped
    being a stream since it was looked up loses nothing.
    """
    link = _attach(amqp, options, timestamp(moment), settled=False)
    try:
        link.drain(1)
        amqp.wait(
            lambda: link.current is not None or not link.draining(),
            options.receive_timeout_s,
            "a stream message or the drain's FLOW",
        )
        delivery = link.current
        if delivery is None:
            return None
        amqp.wait(lambda: not delivery.partial, options.receive_timeout_s, "a whole message")
        payload = link.recv(delivery.pending) or b""
        link.advance()
        delivery.update(Delivery.RELEASED)
        delivery.settle()
        offset = read_stream_offset(payload)
        if offset is None:
            raise _not_a_stream(options)
        return offset
    finally:
        link.close()


def next_offset(amqp: AmqpConnection, options: ReadOptions) -> int:
    """The offset the next message published to the stream will get (0 if it does not exist)."""
    info = look_up(amqp, options)
    return 0 if info is None else info.tail


def resolve(amqp: AmqpConnection, options: ReadOptions, spec: OffsetSpec, info: QueueInfo) -> int:
    """A starting or ending option as a concrete stream offset."""
    if spec.kind is OffsetKind.OFFSET:
        return spec.value
    if spec.kind is OffsetKind.EARLIEST:
        return info.first
    if spec.kind is OffsetKind.TIMESTAMP:
        found = probe_timestamp(amqp, options, spec.value)
        return info.tail if found is None else found
    return info.tail


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One task's ``[start, end)`` of stream offsets."""

    start: int
    end: int


def split(start: int, end: int, parts: int) -> list[OffsetRange]:
    """``[start, end)`` in at most ``parts`` contiguous, nearly equal, non-empty ranges."""
    size = end - start
    if size <= 0:
        return []
    parts = min(parts, size)
    bounds = [start + size * i // parts for i in range(parts + 1)]
    return [OffsetRange(lo, hi) for lo, hi in itertools.pairwise(bounds)]


def read_range(
    options: ReadOptions, columns: tuple[str, ...], part: OffsetRange
) -> Iterator[pa.RecordBatch]:
    """Every message of ``[start, end)`` that the stream still holds, as record batches.

    The gateway keeps about :data:`RANGE_WINDOW` credit, topped up at half and never much past
    the range's end, so it sends without pause while the task decodes.
    """
    amqp = AmqpConnection.open(options.endpoint)
    where = f"stream '{queue_name(options.endpoint.address)}', range [{part.start}, {part.end})"
    try:
        link = _attach(amqp, options, part.start, settled=True)
        impl = link_pointer(link)
        builder = BatchBuilder(columns, stream=True)
        expected = part.start  # the next offset the range needs
        last_arrival = time.monotonic()
        while expected < part.end:
            wanted = min(RANGE_WINDOW, part.end - expected)
            unused = unused_credit(impl)
            if unused <= wanted // 2:
                link.flow(wanted - unused)
            _, payloads, dropped = take_transfers(impl, RANGE_WINDOW, settle=True)
            for offset in builder.add_stream(payloads, part.end):
                if offset is None:
                    raise _not_a_stream(options)
                if offset >= expected:
                    if offset > expected:
                        _lost(options, where, expected, offset)
                    expected = offset + 1
            yield from builder.full_batches()
            if payloads or dropped:
                last_arrival = time.monotonic()
            elif time.monotonic() - last_arrival >= QUIET_S:
                if _exhausted(amqp, link, options):
                    _lost(options, where, expected, part.end)
                    break
                last_arrival = time.monotonic()
            else:
                amqp.pump(POLL_S)
                amqp.check(link)
        yield from builder.finish()
    finally:
        amqp.close()


def _exhausted(amqp: AmqpConnection, link: Receiver, options: ReadOptions) -> bool:
    """Whether the gateway has nothing more for ``link`` now: a drain it answers empty-handed.

    AMQP 1.0 §2.6.7: a draining sender sends what it has within the credit and uses up the
    rest, so once the credit is gone either messages arrived or there were none.
    """
    impl = link_pointer(link)
    link.drain(0)
    amqp.wait(
        lambda: has_transfer(impl) or not link.draining(),
        options.receive_timeout_s,
        "a stream message or the drain's FLOW",
    )
    return link.queued == 0


def _plan_start(options: ReadOptions, info: QueueInfo, start: int, what: str) -> int:
    """A range's start, checked against what the stream still holds (``failOnDataLoss``)."""
    first = info.first
    if start < first:
        _lost(options, f"stream '{info.name}', {what} {start}", start, first)
        return first
    return start


class StreamRangeReader(DataSourceReader):
    """A batch read of ``[startingOffsets, endingOffsets)``, fixed when the query is planned."""

    def __init__(self, options: ReadOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.columns = read_columns(schema)

    def partitions(self) -> list[OffsetRange]:
        """Resolve the two ends now (``latest`` is the tail at planning) and split the range.

        A missing queue (with ``failOnMissing=false``) and an empty range have no partitions.
        """
        options = self.options
        amqp = AmqpConnection.open(options.endpoint)
        try:
            info = look_up(amqp, options)
            if info is None:
                return []
            start = resolve(amqp, options, options.starting_offsets, info)
            end = resolve(amqp, options, options.ending_offsets, info)
        finally:
            amqp.close()
        if start < end:
            start = _plan_start(options, info, start, "startingOffsets")
        assert options.min_partitions is not None
        return split(start, end, options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One range, in an executor (Spark's placeholder partition of an empty read: none)."""
        if not isinstance(partition, OffsetRange):
            return iter(())
        return read_range(self.options, self.columns, partition)


class StreamOffsetReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: micro-batches are offset ranges; the runner only looks at the tail."""

    def __init__(self, options: ReadOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.schema = schema
        self.columns = read_columns(schema)
        self._amqp: AmqpConnection | None = None
        self._until: int | None = None  # Trigger.AvailableNow: the tail when the query began

    def __reduce__(
        self,
    ) -> tuple[type[StreamOffsetReader], tuple[ReadOptions, StructType | None]]:
        """Only the options travel: a connection belongs to the process that opened it."""
        return (StreamOffsetReader, (self.options, self.schema))

    def _connection(self) -> AmqpConnection:
        amqp = self._amqp
        if amqp is not None and amqp.closed:
            amqp.close()
            amqp = None
        if amqp is None:
            amqp = self._amqp = AmqpConnection.open(self.options.endpoint)
        return amqp

    def initialOffset(self) -> dict[str, Any]:
        """``startingOffsets`` as a concrete offset (Spark keeps it in the checkpoint)."""
        amqp = self._connection()
        info = look_up(amqp, self.options)
        if info is None:
            return {"offset": 0}
        return {"offset": resolve(amqp, self.options, self.options.starting_offsets, info)}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerTrigger`` or ``maxBytesPerTrigger`` as Spark's admission control.

        Spark takes one limit; with both options set it gets the rows, and the bytes apply too
        (:meth:`latestOffset`).
        """
        rows = self.options.max_records_per_trigger
        if rows is not None:
            return ReadMaxRows(rows)
        max_bytes = self.options.max_bytes_per_trigger
        return ReadAllAvailable() if max_bytes is None else ReadMaxBytes(max_bytes)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The tail, or less by the read limits or the Trigger.AvailableNow target.

        ``ReadAllAvailable`` (what Spark passes for ``Trigger.Once``) lifts both limits. A
        start below the stream's first offset is data loss (``failOnDataLoss``).
        """
        first = int(start["offset"])
        amqp = self._connection()
        info = look_up(amqp, self.options)
        if info is None:
            return {"offset": first}
        end = info.tail
        if self._until is not None:
            end = min(end, self._until)
        if first < end:
            first = _plan_start(self.options, info, first, "the next micro-batch's start")
        if isinstance(limit, ReadAllAvailable):
            return {"offset": max(end, first)}
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        rows = rows if rows is not None else self.options.max_records_per_trigger
        max_bytes = max_bytes if max_bytes is not None else self.options.max_bytes_per_trigger
        if rows is not None:
            end = min(end, first + rows)
        if max_bytes is not None and end > first:
            end = batch_end(amqp, self.options, first, end, max_bytes)
        return {"offset": max(end, first)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[OffsetRange]:
        """The micro-batch's range in ``minPartitions`` tasks (none when it is empty)."""
        assert self.options.min_partitions is not None
        return split(int(start["offset"]), int(end["offset"]), self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One range, in an executor (Spark's placeholder partition of an empty batch: none)."""
        if not isinstance(partition, OffsetRange):
            return iter(())
        return read_range(self.options, self.columns, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to settle: stream deliveries are settled when sent, and replayable."""

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the tail: the query ends once it has read up to it."""
        self._until = next_offset(self._connection(), self.options)

    def stop(self) -> None:
        """Close the runner's connection."""
        if self._amqp is not None:
            self._amqp.close()
            self._amqp = None
