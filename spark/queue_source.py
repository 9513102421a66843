"""``mode=queue``: a streaming read that consumes a queue at-least-once.

Spark's ``SimpleDataSourceStreamReader`` runs ``read(start)`` and ``commit(end)`` in the one
long-lived streaming runner process of the query (docs/spark.md), so that process can hold
the AMQP link the deliveries arrived on, which is the only link they can be settled on.
``read(start)`` hands Spark the buffered messages as Arrow batches and keeps their deliveries
unsettled. Spark asks for the batch after ``start`` only once the batch ending at ``start`` is in
its commit log (sequential micro-batch execution, docs/spark.md), so ``read(start)``
settles everything up to ``start`` as ``accepted``; ``commit(end)`` (one batch late, and never
for the last batch before a stop) settles the same if still unsettled. Settling at ``read`` is
what lets the last batch of a quiet queue be settled without waiting for more messages.
Asynchronous progress tracking, which asks before the commit, would break this and is not
supported.

If the query, the runner or the driver dies, the connection drops and the gateway releases
everything unsettled with its delivery-count raised (the ``delivery_count`` column), so a restart
receives it again. A batch Spark replays from its offset log after a restart is therefore empty
(``readBetweenOffsets``): its messages come back as new deliveries instead.

Offsets are ``{"epoch": E, "seq": N}``: ``E`` names the connection, ``N`` counts the messages
handed to Spark on it. Only offsets of the live epoch settle anything.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
from proton import Delivery
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from sluicegate.spark.options import ReadOptions
from sluicegate.spark.queue_receiver import QueueReceiver
from sluicegate.spark.records import BatchBuilder

# The offset of a query that has read nothing yet: no connection has an empty epoch.
INITIAL_OFFSET: Final[dict[str, Any]] = {"epoch": "", "seq": 0}


class QueueStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Consumes a queue through one receiver held by the streaming runner.

    Constructed in planner processes too and pickled, so it connects on first use only.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._receiver: QueueReceiver | None = None
        self._seq = 0
        # Batches handed to Spark and not yet committed: (end seq, their deliveries).
        self._held: deque[tuple[int, list[Delivery]]] = deque()
        self._available_now = False

    def __reduce__(self) -> tuple[type[QueueStreamReader], tuple[ReadOptions]]:
        """Only the options travel: a connection belongs to the process that opened it."""
        return (QueueStreamReader, (self.options,))

    def initialOffset(self) -> dict[str, Any]:
        """Nothing read yet (Spark ignores this on a restart and uses its checkpoint)."""
        return dict(INITIAL_OFFSET)

    def _connected(self) -> QueueReceiver:
        receiver = self._receiver
        if receiver is not None and receiver.failure is not None:
            # What it held was released by the gateway and will be delivered again.
            receiver.close()
            self._held.clear()
            receiver = None
        if receiver is None:
            endpoint = self.options.endpoint
            receiver = QueueReceiver(endpoint, self.options.credit)
            self._receiver = receiver
            self._seq = 0
            if self._available_now:
                receiver.drain()
        return receiver

    def read(self, start: dict[str, Any]) -> tuple[Iterator[pa.RecordBatch], dict[str, Any]]:
        """Hand Spark what has arrived, within ``maxRecordsPerTrigger``/``maxBytesPerTrigger``."""
        receiver = self._connected()
        if start.get("epoch") == receiver.epoch and start.get("seq") != self._seq:
            raise RuntimeError(
                f"sluicegate: Spark asked to read from {start}, but this connection has handed "
                f"out messages up to seq {self._seq}"
            )
        if start.get("epoch") == receiver.epoch:
            self._settle(receiver, int(start["seq"]))
        taken = receiver.take(
            self.options.max_records_per_trigger,
            self.options.max_bytes_per_trigger,
            self.options.receive_timeout_s,
        )
        if not taken:
            return iter(()), start
        builder = BatchBuilder()
        seq = self._seq
        for _, payload in taken:
            seq += 1
            builder.add(payload, seq)
        self._seq = seq
        self._held.append((seq, [delivery for delivery, _ in taken]))
        return iter(builder.finish()), {"epoch": receiver.epoch, "seq": seq}

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[pa.RecordBatch]:
        """A batch replayed after a restart: its messages were released, so it is empty."""
        return iter(())

    def commit(self, end: dict[str, Any]) -> None:
        """Settle ``accepted`` every message of the batches up to ``end`` (if not yet done)."""
        receiver = self._receiver
        if receiver is not None and end.get("epoch") == receiver.epoch:
            self._settle(receiver, int(end["seq"]))

    def _settle(self, receiver: QueueReceiver, last: int) -> None:
        settled: list[Delivery] = []
        held = self._held
        while held and held[0][0] <= last:
            settled.extend(held.popleft()[1])
        receiver.accept(settled)

    def prepareForTriggerAvailableNow(self) -> None:
        """Drain the queue: the query ends at the first drain that finds it empty.

        A queue has no offsets to stop at, so what a producer publishes while the query runs
        is read too; a producer faster than the query keeps it running.
        """
        self._available_now = True
        if self._receiver is not None:
            self._receiver.drain()

    def stop(self) -> None:
        """Close the connection; whatever was not committed goes back to the queue."""
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
