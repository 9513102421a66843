"""The sink: every Spark task sends its rows as messages, unsettled, and waits for each outcome.

A task sends only while the link has credit, so the gateway's publisher flow control (its link
credit and its memory budget) paces Spark rather than the other way round. ``accepted`` counts a
row as written; ``released`` or ``modified`` sends the same bytes again (up to
``maxSendAttempts``); ``rejected`` fails the task with the gateway's error condition, so Spark
retries it or fails the job. Nothing is recalled on abort: the sink is at-least-once, and every
message carries a deterministic message-id, ``QUERY:BATCH:PARTITION:ROW``, so a retried task
sends the ids its failed attempt sent and a consumer (or a deduplicating broker) can drop them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_REJECTED,
    PN_RELEASED,
    pn_condition_get_description,
    pn_condition_get_name,
    pn_condition_is_set,
    pn_delivery,
    pn_delivery_remote,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_disposition_condition,
    pn_link_advance,
    pn_link_credit,
    pn_link_send,
)
from proton import Condition, Message, Sender, symbol
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from sluicegate.spark.amqp import POLL_S, AmqpConnection, AmqpError, describe
from sluicegate.spark.options import OptionError, WriteOptions

_STRING_MAP: Final = MapType(StringType(), StringType())
# The columns a sink takes and the types each may have. ``delivery_count`` and ``offset`` are
# the gateway's, accepted so that a read's rows can be written back unchanged, and ignored.
SINK_COLUMNS: Final[dict[str, tuple[DataType, ...]]] = {
    "body": (BinaryType(), StringType()),
    "message_id": (StringType(),),
    "correlation_id": (StringType(),),
    "subject": (StringType(),),
    "content_type": (StringType(),),
    "creation_time": (TimestampType(),),
    "application_properties": (_STRING_MAP,),
    "message_annotations": (_STRING_MAP,),
}
IGNORED_COLUMNS: Final = frozenset({"delivery_count", "offset"})
_OUTCOMES: Final = frozenset({PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED})


def check_sink_schema(schema: StructType) -> tuple[str, ...]:
    """The columns to send; an unknown column or a wrong type is an error naming it."""
    columns: list[str] = []
    for field in schema.fields:
        if field.name in IGNORED_COLUMNS:
            continue
        allowed = SINK_COLUMNS.get(field.name)
        if allowed is None:
            known = ", ".join([*SINK_COLUMNS, *sorted(IGNORED_COLUMNS)])
            raise OptionError(f"sluicegate sink: unknown column {field.name!r}; known: {known}")
        if field.dataType not in allowed:
            expected = " or ".join(t.simpleString() for t in allowed)
            raise OptionError(
                f"sluicegate sink: column {field.name} is {field.dataType.simpleString()}, "
                f"expected {expected}"
            )
        columns.append(field.name)
    if "body" not in columns:
        raise OptionError("sluicegate sink: a column named body (binary or string) is required")
    return tuple(columns)


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task wrote: ``count`` messages accepted, ``sent`` transfers (with resends)."""

    partition: int
    count: int
    sent: int


# Sink columns and the proton ``Message`` attributes they set.
_ATTRIBUTES: Final = {
    "correlation_id": "correlation_id",
    "subject": "subject",
    "content_type": "content_type",
}


def _messages(
    batches: Iterator[pa.RecordBatch], columns: tuple[str, ...], id_prefix: str
) -> Iterator[bytes]:
    """Each row encoded as an AMQP message, with the deterministic id unless the row has one."""
    row = 0
    for batch in batches:
        values = {name: batch.column(name).to_pylist() for name in columns}
        for index in range(batch.num_rows):
            body = values["body"][index]
            given_id = values["message_id"][index] if "message_id" in values else None
            fields: dict[str, Any] = {
                # bytes go in a data section, not an amqp-value
                "inferred": True,
                "body": body.encode() if isinstance(body, str) else body,
                "id": given_id if given_id is not None else f"{id_prefix}:{row}",
            }
            for column, attribute in _ATTRIBUTES.items():
                if column in values and values[column][index] is not None:
                    fields[attribute] = values[column][index]
            created = values["creation_time"][index] if "creation_time" in values else None
            if created is not None:
                fields["creation_time"] = created.timestamp()
            if "application_properties" in values and values["application_properties"][index]:
                fields["properties"] = dict(values["application_properties"][index])
            if "message_annotations" in values and values["message_annotations"][index]:
                fields["annotations"] = {
                    symbol(key): value for key, value in values["message_annotations"][index]
                }
            row += 1
            yield Message(**fields).encode()


def _rejection(delivery: Any) -> Condition | None:
    """The error condition of a ``rejected`` outcome (AMQP 1.0 §3.4.3), if it has one."""
    condition = pn_disposition_condition(pn_delivery_remote(delivery))
    if not pn_condition_is_set(condition):
        return None
    return Condition(pn_condition_get_name(condition), pn_condition_get_description(condition))


class _Transfers:
    """Sends encoded messages within the link's credit and collects their outcomes.

    Per message it calls proton's C API on the link directly (as ``gateway/deliveries.py``
    does): proton's ``Delivery`` wrapper costs more than the rest of a send together.
    """

    def __init__(self, amqp: AmqpConnection, link: Sender, options: WriteOptions) -> None:
        self.amqp = amqp
        self.link = link
        self._impl = link._impl  # the pn_link_t of proton's wrapper
        self.options = options
        # In sending order: (pn_delivery_t, encoded message, attempt).
        self.inflight: deque[tuple[Any, bytes, int]] = deque()
        self.retry: list[tuple[bytes, int]] = []
        self.accepted = 0
        self.sent = 0
        self._tag = 0

    def _send(self, payload: bytes, attempt: int) -> None:
        self._tag += 1
        delivery = pn_delivery(self._impl, self._tag.to_bytes(8, "big"))
        pn_link_send(self._impl, payload)
        pn_link_advance(self._impl)
        self.inflight.append((delivery, payload, attempt))
        self.sent += 1

    def run(self, payloads: Iterator[bytes]) -> None:
        """Send everything and wait until every message is accepted."""
        pending = iter(payloads)
        exhausted = False
        last_progress = time.monotonic()
        link = self._impl
        while True:
            while pn_link_credit(link) > 0 and (self.retry or not exhausted):
                if self.retry:
                    self._send(*self.retry.pop())
                    continue
                payload = next(pending, None)
                if payload is None:
                    exhausted = True
                    break
                self._send(payload, 1)
            if exhausted and not self.inflight and not self.retry:
                return
            progressed = self.amqp.pump(POLL_S)
            self.amqp.check(self.link)
            if self._outcomes() or progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.options.send_timeout_s:
                raise TimeoutError(
                    f"{self.options.endpoint.address}: no credit or outcome from the gateway "
                    f"for {self.options.send_timeout_s:g} s ({len(self.inflight)} unsettled)"
                )

    def _outcomes(self) -> bool:
        """Take the outcomes that have come back, oldest first (the gateway settles in order)."""
        inflight = self.inflight
        taken = False
        while inflight:
            delivery, payload, attempt = inflight[0]
            outcome = pn_delivery_remote_state(delivery)
            if outcome not in _OUTCOMES:
                break
            inflight.popleft()
            taken = True
            if outcome == PN_ACCEPTED:
                pn_delivery_settle(delivery)
                self.accepted += 1
                continue
            if outcome == PN_REJECTED:
                reason = describe(_rejection(delivery), "rejected")
                pn_delivery_settle(delivery)
                raise AmqpError(f"{self.options.endpoint.address}: message rejected: {reason}")
            pn_delivery_settle(delivery)
            if attempt >= self.options.max_send_attempts:
                raise AmqpError(
                    f"{self.options.endpoint.address}: message released {attempt} times; giving up"
                )
            self.retry.append((payload, attempt + 1))
        return taken


def send_partition(
    options: WriteOptions,
    columns: tuple[str, ...],
    query_id: str,
    batches: Iterator[pa.RecordBatch],
) -> SinkCommit:
    """One task's work: connect, send its rows, wait for every outcome, close."""
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    batch_id = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    streaming_query = (
        context.getLocalProperty("sql.streaming.queryId") if context is not None else None
    )
    prefix = f"{streaming_query or query_id}:{batch_id or 0}:{partition}"
    amqp = AmqpConnection.open(options.endpoint)
    try:
        link = amqp.sender(options.endpoint.address, timeout=options.endpoint.connect_timeout_s)
        transfers = _Transfers(amqp, link, options)
        transfers.run(_messages(batches, columns, prefix))
        return SinkCommit(partition, transfers.accepted, transfers.sent)
    finally:
        amqp.close()


class SinkWriter(DataSourceArrowWriter):
    """A batch write (``df.write.format("sluicegate")``); ``query_id`` is drawn per write."""

    def __init__(self, options: WriteOptions, columns: tuple[str, ...], query_id: str) -> None:
        self.options = options
        self.columns = columns
        self.query_id = query_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Send this task's rows."""
        return send_partition(self.options, self.columns, self.query_id, iterator)

    def commit(self, messages: list[Any]) -> None:
        """Nothing to do: every message was accepted before its task finished."""

    def abort(self, messages: list[Any]) -> None:
        """Nothing can be recalled: what was accepted stays (at-least-once)."""


class SinkStreamWriter(DataSourceStreamArrowWriter):
    """A streaming sink: the query id and batch id come from the task's local properties."""

    def __init__(self, options: WriteOptions, columns: tuple[str, ...], query_id: str) -> None:
        self.options = options
        self.columns = columns
        self.query_id = query_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Send this task's rows."""
        return send_partition(self.options, self.columns, self.query_id, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Nothing to do: every message was accepted before its task finished."""

    def abort(self, messages: list[Any], batchId: int) -> None:
        """Nothing can be recalled: what was accepted stays (at-least-once)."""
