"""``mode=stream``: fixed offset ranges of a stream queue, batch and streaming, replayable.

A stream queue keeps its messages after they are read and numbers them (``x-stream-offset`` in
each message's annotations). A Spark offset here is ``{"offset": N}``, the next stream offset
to read; a micro-batch or a batch read is the range ``[start, end)``, split into
``minPartitions`` tasks. Each task attaches with the ``rabbitmq:stream-offset-spec`` filter set
to its first offset and stops at its end, so a replayed range reads the same messages again:
exactly-once with an idempotent sink.

Where the stream ends is learnt over AMQP alone, the way any client can: a receiver attached at
``last`` is drained for one message, whose offset is the tail (no message: the stream is
empty). The same probe at a timestamp finds the first offset at or after it.

``maxBytesPerTrigger`` needs the size of each message before its batch is planned, which the
gateway does not tell: the runner reads the stream ahead of the batches once (:class:`SizeScan`,
keeping only each message's offset and size) and ends each batch by ``spark.size_index``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from cproton import (
    pn_delivery_aborted,
    pn_delivery_partial,
    pn_delivery_pending,
    pn_delivery_readable,
    pn_delivery_settle,
    pn_link_advance,
    pn_link_current,
    pn_link_recv,
)
from proton import Delivery, Message, Receiver, timestamp
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sluicegate.spark.amqp import AmqpConnection, AmqpError
from sluicegate.spark.options import OffsetKind, OffsetSpec, ReadOptions
from sluicegate.spark.records import BATCH_ROWS, STREAM_OFFSET_ANNOTATION, BatchBuilder
from sluicegate.spark.size_index import SizeIndex
from sluicegate.wire.annotations import read_stream_offset

OFFSET_SPEC: Final = "rabbitmq:stream-offset-spec"
# Credit per drain round of a range read: one record batch's worth.
RANGE_WINDOW: Final = BATCH_ROWS
# Most credit per drain round of the size scan: sizes are 16 bytes each in the index, but the
# messages cross the network whole, so the scan reads little beyond the batch it plans.
SCAN_WINDOW: Final = BATCH_ROWS


def _complete(delivery: Delivery | None) -> bool:
    return delivery is not None and delivery.readable and not delivery.partial


def _not_a_stream(options: ReadOptions) -> AmqpError:
    return AmqpError(
        f"{options.endpoint.address}: not a stream queue "
        f"(a message without {STREAM_OFFSET_ANNOTATION})"
    )


def _attach(amqp: AmqpConnection, options: ReadOptions, spec: object) -> Receiver:
    endpoint = options.endpoint
    return amqp.receiver(
        endpoint.address,
        settled=True,
        filters={OFFSET_SPEC: (OFFSET_SPEC, spec)},
        timeout=endpoint.connect_timeout_s,
    )


def _drained(amqp: AmqpConnection, link: Receiver, credit: int, timeout: float) -> Iterator[bytes]:
    """Grant ``credit`` with drain; yield each message until the gateway has sent all it had."""
    link.drain(credit)
    while True:
        delivery = link.current
        while _complete(delivery):
            assert delivery is not None
            payload = link.recv(delivery.pending) or b""
            link.advance()
            delivery.settle()
            if not delivery.aborted:
                yield payload
            delivery = link.current
        if not link.draining() and link.queued == 0:
            return
        amqp.wait(
            lambda: _complete(link.current) or not link.draining(),
            timeout,
            "a stream message or the drain's FLOW",
        )


def _complete_raw(delivery: Any) -> bool:
    """:func:`_complete` for a ``pn_delivery_t`` (NULL when the link has no current one)."""
    return bool(delivery) and pn_delivery_readable(delivery) and not pn_delivery_partial(delivery)


def _measured_round(
    amqp: AmqpConnection,
    link: Receiver,
    credit: int,
    timeout: float,
    each: Callable[[bytearray], None],
) -> None:
    """Like :func:`_drained`, handing each message to ``each``, through proton's C API.

    The size scan's per-message path: proton's ``Delivery`` wrapper costs more than the rest.
    """
    impl = link._impl  # the pn_link_t of proton's wrapper
    link.drain(credit)
    while True:
        delivery = pn_link_current(impl)
        while _complete_raw(delivery):
            _, payload = pn_link_recv(impl, pn_delivery_pending(delivery))
            pn_link_advance(impl)
            aborted = pn_delivery_aborted(delivery)
            pn_delivery_settle(delivery)
            if not aborted:
                each(payload)
            delivery = pn_link_current(impl)
        if not link.draining() and link.queued == 0:
            return
        amqp.wait(
            lambda: _complete_raw(pn_link_current(impl)) or not link.draining(),
            timeout,
            "a stream message or the drain's FLOW",
        )


def probe(amqp: AmqpConnection, options: ReadOptions, spec: object) -> int | None:
    """The offset of the first message a reader attached at ``spec`` gets; None if none."""
    link = _attach(amqp, options, spec)
    try:
        for payload in _drained(amqp, link, 1, options.receive_timeout_s):
            message = Message()
            message.decode(payload)
            annotations: dict[Any, Any] = message.annotations or {}
            offset = annotations.get(STREAM_OFFSET_ANNOTATION)
            if not isinstance(offset, int):
                raise _not_a_stream(options)
            return offset
        return None
    finally:
        link.close()


def next_offset(amqp: AmqpConnection, options: ReadOptions) -> int:
    """The offset the next message published to the stream will get (0 if it is empty)."""
    last = probe(amqp, options, "last")
    return 0 if last is None else last + 1


def resolve(amqp: AmqpConnection, options: ReadOptions, spec: OffsetSpec) -> int:
    """A starting or ending option as a concrete stream offset."""
    if spec.kind is OffsetKind.OFFSET:
        return spec.value
    if spec.kind is OffsetKind.EARLIEST:
        first = probe(amqp, options, "first")
        return next_offset(amqp, options) if first is None else first
    if spec.kind is OffsetKind.TIMESTAMP:
        found = probe(amqp, options, timestamp(spec.value))
        return next_offset(amqp, options) if found is None else found
    return next_offset(amqp, options)


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


def read_range(options: ReadOptions, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Every message of ``[start, end)`` that the stream still holds, as record batches."""
    amqp = AmqpConnection.open(options.endpoint)
    try:
        link = _attach(amqp, options, part.start)
        builder = BatchBuilder()
        remaining = part.end - part.start
        while remaining > 0:
            received = 0
            reached = False
            for payload in _drained(
                amqp, link, min(remaining, RANGE_WINDOW), options.receive_timeout_s
            ):
                received += 1
                offset = builder.add(payload, None, below=part.end)
                if offset is None:
                    raise _not_a_stream(options)
                if offset >= part.end - 1:
                    reached = True
            yield from builder.finish()
            if reached or received == 0:
                return
            remaining -= received
    finally:
        amqp.close()


class SizeScan:
    """The runner's reader of message sizes, for ``maxBytesPerTrigger``.

    One settled receiver, kept attached across polls on the runner's connection, reads the
    stream from the first batch's start on, only as far as the batch being planned needs; each
    message is measured (its encoded size, as ``mode=queue`` counts) and dropped, its body never
    decoded. A start the index does not cover (a restart from a checkpoint) reads again from
    there.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._amqp: AmqpConnection | None = None
        self._link: Receiver | None = None
        self._index = SizeIndex(0)

    def end(self, amqp: AmqpConnection, start: int, stop: int, max_bytes: int) -> int:
        """Where the batch from ``start`` ends: by ``stop``, within ``max_bytes`` but for one."""
        index = self._index
        if self._link is None or amqp is not self._amqp or not index.covers(start):
            index = self._restart(amqp, start)
        link = self._link
        assert link is not None
        index.discard_below(start)
        while (end := index.end_within(start, stop, max_bytes)) is None:
            credit = index.credit_hint(start, max_bytes, min(SCAN_WINDOW, stop - index.position))
            if not self._measure(amqp, link, credit, index):
                return stop  # nothing left below the tail to measure: the rest is empty
        return end

    def _offset(self, payload: bytes | bytearray) -> int:
        offset = read_stream_offset(memoryview(payload))
        if offset is None:
            raise _not_a_stream(self.options)
        return offset

    def _measure(self, amqp: AmqpConnection, link: Receiver, credit: int, index: SizeIndex) -> int:
        """Read up to ``credit`` messages into ``index``; how many came.

        A stream hands a reader its messages in offset order, so when the last of a round is
        as far from where the round began as the round is long, its offsets are consecutive
        and only that one is decoded. A round with a gap (retention dropped messages before or
        while it was read) is read again from where it began, decoding every message's offset.
        """
        timeout = self.options.receive_timeout_s
        sizes: list[int] = []
        last = bytearray()

        def measure(payload: bytearray) -> None:
            nonlocal last
            sizes.append(len(payload))
            last = payload

        _measured_round(amqp, link, credit, timeout, measure)
        if not sizes:
            return 0
        first = index.position
        if self._offset(last) - first == len(sizes) - 1:
            for step, size in enumerate(sizes):
                index.record(first + step, size)
            return len(sizes)
        link.close()
        link = self._link = _attach(amqp, self.options, first)
        received = 0

        def record(payload: bytearray) -> None:
            nonlocal received
            index.record(self._offset(payload), len(payload))
            received += 1

        _measured_round(amqp, link, credit, timeout, record)
        return received

    def _restart(self, amqp: AmqpConnection, start: int) -> SizeIndex:
        if self._link is not None and amqp is self._amqp and not amqp.closed:
            self._link.close()
        self._amqp = amqp
        self._link = _attach(amqp, self.options, start)
        self._index = SizeIndex(start)
        return self._index


class StreamRangeReader(DataSourceReader):
    """A batch read of ``[startingOffsets, endingOffsets)``, fixed when the query is planned."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[OffsetRange]:
        """Resolve the two ends now (``latest`` is the tail at planning) and split the range."""
        amqp = AmqpConnection.open(self.options.endpoint)
        try:
            start = resolve(amqp, self.options, self.options.starting_offsets)
            end = resolve(amqp, self.options, self.options.ending_offsets)
        finally:
            amqp.close()
        return split(start, end, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One range, in an executor."""
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)


class StreamOffsetReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: micro-batches are offset ranges; the runner only looks at the tail."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._amqp: AmqpConnection | None = None
        self._until: int | None = None  # Trigger.AvailableNow: the tail when the query began
        self._sizes: SizeScan | None = None  # maxBytesPerTrigger's look-ahead, in the runner

    def __reduce__(self) -> tuple[type[StreamOffsetReader], tuple[ReadOptions]]:
        """Only the options travel: a connection belongs to the process that opened it."""
        return (StreamOffsetReader, (self.options,))

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
        return {"offset": resolve(self._connection(), self.options, self.options.starting_offsets)}

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

        ``ReadAllAvailable`` (what Spark passes for ``Trigger.Once``) lifts both limits.
        """
        first = int(start["offset"])
        amqp = self._connection()
        end = next_offset(amqp, self.options)
        if self._until is not None:
            end = min(end, self._until)
        if isinstance(limit, ReadAllAvailable):
            return {"offset": max(end, first)}
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        rows = rows if rows is not None else self.options.max_records_per_trigger
        max_bytes = max_bytes if max_bytes is not None else self.options.max_bytes_per_trigger
        if rows is not None:
            end = min(end, first + rows)
        if max_bytes is not None and end > first:
            if self._sizes is None:
                self._sizes = SizeScan(self.options)
            end = self._sizes.end(amqp, first, end, max_bytes)
        return {"offset": max(end, first)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[OffsetRange]:
        """The micro-batch's range in ``minPartitions`` tasks (none when it is empty)."""
        return split(int(start["offset"]), int(end["offset"]), self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One range, in an executor."""
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)

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
