"""The sink: every Spark task sends its rows as messages, unsettled, and waits for each outcome.

A task sends only while the link has credit, so the gateway's publisher flow control (its link
credit and its memory budget) paces Spark rather than the other way round. ``accepted`` counts a
row as written; ``released`` or ``modified`` sends the same bytes again (up to
``maxSendAttempts``); ``rejected`` fails the task with the gateway's error condition, so Spark
retries it or fails the job. Nothing is recalled on abort: the sink is at-least-once, and every
message carries a deterministic message-id, ``QUERY:BATCH:PARTITION:ROW``, so a retried task
sends the ids its failed attempt sent and a consumer (or a deduplicating broker) can drop them.

Messages are durable unless ``durable=false``: a durable queue keeps them across a gateway
restart (the header's durable flag, AMQP 1.0 §3.2.1). Rows are encoded by
``spark/message_encoding.py`` straight from Arrow's columns, with no ``proton.Message`` per row.
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from proton import Condition, Sender
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
)

from sluicegate.clients.capi import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_REJECTED,
    PN_RELEASED,
    link_pointer,
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
from sluicegate.spark.amqp import POLL_S, AmqpConnection, AmqpError, describe
from sluicegate.spark.message_encoding import encode_message
from sluicegate.spark.options import OptionError, WriteOptions
from sluicegate.spark.variant import decode_variant
from sluicegate.wire.amqp_types import Byte, Float32, Int, Short, Symbol, Timestamp

# The string columns a sink takes, and where each goes.
_STRINGS: Final = ("message_id", "correlation_id", "subject", "content_type")
_MAPS: Final = ("application_properties", "message_annotations")
# Columns a read produces that describe a delivery, not a message: accepted so that a read's
# rows can be written back unchanged, and ignored.
IGNORED_COLUMNS: Final = frozenset({"delivery_count", "redelivered", "offset"})
KNOWN_COLUMNS: Final = (
    "body",
    *_STRINGS,
    "creation_time",
    *_MAPS,
    "application_properties_typed",
)
_OUTCOMES: Final = frozenset({PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED})
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_DATE: Final = datetime.date(1970, 1, 1)
_MILLISECOND: Final = datetime.timedelta(milliseconds=1)
Convert = Callable[[Any], Any]


def _millis(moment: datetime.datetime) -> Timestamp:
    """A Spark timestamp (aware, UTC) or timestamp_ntz (naive, read as UTC) in AMQP's ms."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return Timestamp((moment - _EPOCH) // _MILLISECOND)


def _converter(data_type: DataType, column: str) -> Convert | None:
    """How a Spark value becomes the AMQP-typed Python value the encoder writes (None: as is).

    ``OptionError`` names the column for a type with no AMQP counterpart.
    """
    simple: dict[type[DataType], Convert | None] = {
        StringType: None,
        LongType: None,
        DoubleType: None,
        BooleanType: None,
        DecimalType: None,
        NullType: None,
        BinaryType: bytes,
        ByteType: Byte,
        ShortType: Short,
        IntegerType: Int,
        FloatType: Float32,
        TimestampType: _millis,
        TimestampNTZType: _millis,
        DateType: lambda day: Timestamp((day - _EPOCH_DATE).days * 86_400_000),
    }
    kind = type(data_type)
    if kind in simple:
        return simple[kind]
    if isinstance(data_type, VariantType):
        return lambda value: decode_variant(value["value"], value["metadata"])
    if isinstance(data_type, ArrayType):
        item = _converter(data_type.elementType, column)
        if item is None:
            return list
        return lambda values: [None if v is None else item(v) for v in values]
    if isinstance(data_type, MapType):
        return _map_converter(data_type, column)
    if isinstance(data_type, StructType):
        fields = [(f.name, _converter(f.dataType, column)) for f in data_type.fields]
        return lambda row: {
            name: row[name] if convert is None or row[name] is None else convert(row[name])
            for name, convert in fields
        }
    raise OptionError(
        f"sluicegate sink: column {column} holds {data_type.simpleString()} values, which have "
        "no AMQP type"
    )


def _map_converter(data_type: MapType, column: str) -> Convert:
    """A ``map<string,*>`` (Arrow hands it over as key-value pairs) as a dict of AMQP values."""
    if not isinstance(data_type.keyType, StringType):
        raise OptionError(
            f"sluicegate sink: column {column} is {data_type.simpleString()}; its keys must be "
            "strings"
        )
    value = _converter(data_type.valueType, column)
    if value is None:
        return dict
    return lambda pairs: {k: None if v is None else value(v) for k, v in pairs}


@dataclass(frozen=True)
class SinkColumns:
    """The columns a sink sends, each with how its values become AMQP values."""

    names: tuple[str, ...]
    converters: tuple[Convert | None, ...]


def check_sink_schema(schema: StructType) -> SinkColumns:
    """The columns to send; an unknown column or a type with no AMQP counterpart is named.

    ``body`` is binary or string; ``message_id``, ``correlation_id``, ``subject`` and
    ``content_type`` strings; ``creation_time`` a timestamp; ``application_properties`` and
    ``message_annotations`` any ``map<string,*>`` whose values AMQP can carry (numbers keep
    their width, e.g. ``int`` an AMQP int); ``application_properties_typed`` a variant object.
    """
    names: list[str] = []
    converters: list[Convert | None] = []
    for field in schema.fields:
        name, data_type = field.name, field.dataType
        if name in IGNORED_COLUMNS:
            continue
        if name not in KNOWN_COLUMNS:
            known = ", ".join([*KNOWN_COLUMNS, *sorted(IGNORED_COLUMNS)])
            raise OptionError(f"sluicegate sink: unknown column {name!r}; known: {known}")
        expected = {
            "body": (BinaryType, StringType),
            "creation_time": (TimestampType, TimestampNTZType),
            "application_properties": (MapType,),
            "message_annotations": (MapType,),
            "application_properties_typed": (VariantType,),
        }.get(name, (StringType,))
        if not isinstance(data_type, expected):
            wanted = {
                "application_properties": "map<string,*>",
                "message_annotations": "map<string,*>",
            }.get(name, " or ".join(t().simpleString() for t in expected))
            raise OptionError(
                f"sluicegate sink: column {name} is {data_type.simpleString()}, expected {wanted}"
            )
        names.append(name)
        converters.append(_converter(data_type, name) if name not in ("body", *_STRINGS) else None)
    if "body" not in names:
        raise OptionError("sluicegate sink: a column named body (binary or string) is required")
    return SinkColumns(tuple(names), tuple(converters))


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task wrote: ``count`` messages accepted, ``sent`` transfers (with resends)."""

    partition: int
    count: int
    sent: int


def _column(batch: pa.RecordBatch, name: str, convert: Convert | None) -> list[Any]:
    values: list[Any] = batch.column(name).to_pylist()
    if convert is None:
        return values
    return [None if value is None else convert(value) for value in values]


def _messages(
    batches: Iterator[pa.RecordBatch], columns: SinkColumns, id_prefix: str, durable: bool
) -> Iterator[bytes]:
    """Each row encoded as an AMQP message, with the deterministic id unless the row has one.

    A row's ``application_properties_typed`` object, when it has one, is its application
    properties; otherwise its ``application_properties`` map is.
    """
    row = 0
    for batch in batches:
        values = {
            name: _column(batch, name, convert)
            for name, convert in zip(columns.names, columns.converters, strict=True)
        }
        count = batch.num_rows
        none = [None] * count
        bodies = values["body"]
        ids = values.get("message_id", none)
        correlations = values.get("correlation_id", none)
        subjects = values.get("subject", none)
        content_types = values.get("content_type", none)
        created = values.get("creation_time", none)
        typed = values.get("application_properties_typed", none)
        properties = values.get("application_properties", none)
        annotations = values.get("message_annotations", none)
        for index in range(count):
            body = bodies[index]
            given = ids[index]
            application = typed[index]
            if application is not None and not isinstance(application, dict):
                raise OptionError(
                    "sluicegate sink: application_properties_typed must hold a variant object, "
                    f"not {type(application).__name__}"
                )
            if application is None:
                application = properties[index]
            annotated = annotations[index]
            yield encode_message(
                body.encode() if isinstance(body, str) else (body or b""),
                durable=durable,
                message_id=given if given is not None else f"{id_prefix}:{row}",
                correlation_id=correlations[index],
                subject=subjects[index],
                content_type=content_types[index],
                creation_time=created[index],
                application_properties=application,
                message_annotations=(
                    {Symbol(key): value for key, value in annotated.items()} if annotated else None
                ),
            )
            row += 1


def _rejection(delivery: Any) -> Condition | None:
    """The error condition of a ``rejected`` outcome (AMQP 1.0 §3.4.3), if it has one."""
    condition = pn_disposition_condition(pn_delivery_remote(delivery))
    if not pn_condition_is_set(condition):
        return None
    return Condition(pn_condition_get_name(condition), pn_condition_get_description(condition))


class _Transfers:
    """Sends encoded messages within the link's credit and collects their outcomes.

    Per message it calls proton's C API on the link directly (as ``gateway/proton/deliveries.py``
    does): proton's ``Delivery`` wrapper costs more than the rest of a send together.
    """

    def __init__(self, amqp: AmqpConnection, link: Sender, options: WriteOptions) -> None:
        self.amqp = amqp
        self.link = link
        self._impl = link_pointer(link)
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
    columns: SinkColumns,
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
        transfers.run(_messages(batches, columns, prefix, options.durable))
        return SinkCommit(partition, transfers.accepted, transfers.sent)
    finally:
        amqp.close()


class SinkWriter(DataSourceArrowWriter):
    """A batch write (``df.write.format("sluicegate")``); ``query_id`` is drawn per write."""

    def __init__(self, options: WriteOptions, columns: SinkColumns, query_id: str) -> None:
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

    def __init__(self, options: WriteOptions, columns: SinkColumns, query_id: str) -> None:
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
