"""``mode=browse``: a batch read of a queue that leaves the queue as it was.

The receiver attaches with ``distribution-mode = copy`` (AMQP 1.0 §3.5.3): the gateway sends
copies of the messages, available and acquired alike, and settles them itself. To know where the
queue ends without counting it first, the read drains (§2.6.7): it grants a window of credit with
the drain flag, and the gateway either sends that many copies or advances the link's
delivery-count over the rest and answers at once; a window not used up means the end was reached.
Messages published during the read may or may not be included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import pyarrow as pa
from proton import Delivery
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sluicegate.spark.amqp import AmqpConnection
from sluicegate.spark.options import ReadOptions
from sluicegate.spark.records import BATCH_ROWS, BatchBuilder

# Credit per drain round: one record batch's worth keeps the copies in flight bounded.
BROWSE_WINDOW: Final = BATCH_ROWS


def _complete(delivery: Delivery | None) -> bool:
    return delivery is not None and delivery.readable and not delivery.partial


def browse(options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Every message of the queue at the time of the read, as record batches."""
    endpoint = options.endpoint
    amqp = AmqpConnection.open(endpoint)
    try:
        link = amqp.receiver(endpoint.address, copy=True, timeout=endpoint.connect_timeout_s)
        position = 0
        while True:
            link.drain(BROWSE_WINDOW)
            builder = BatchBuilder()
            received = 0
            while True:
                delivery = link.current
                while _complete(delivery):
                    assert delivery is not None
                    payload = link.recv(delivery.pending) or b""
                    link.advance()
                    delivery.settle()
                    if not delivery.aborted:
                        position += 1
                        builder.add(payload, position)
                    received += 1
                    delivery = link.current
                if not link.draining() and link.queued == 0:
                    break
                amqp.wait(
                    lambda: _complete(link.current) or not link.draining(),
                    options.receive_timeout_s,
                    "a browsed message or the drain's FLOW",
                )
            yield from builder.finish()
            if received < BROWSE_WINDOW:
                return
    finally:
        amqp.close()


class BrowseReader(DataSourceReader):
    """One partition: a queue is browsed in order by one receiver."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        """A single task (its order is the queue's)."""
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Browse the whole queue in the executor."""
        return browse(self.options)
