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
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sluicegate.clients.capi import has_transfer, link_pointer, take_transfers
from sluicegate.spark.amqp import AmqpConnection
from sluicegate.spark.options import ReadOptions
from sluicegate.spark.queue_info import look_up
from sluicegate.spark.records import BATCH_ROWS, BatchBuilder, read_columns

# Credit per drain round: one record batch's worth keeps the copies in flight bounded.
BROWSE_WINDOW: Final = BATCH_ROWS


def browse(options: ReadOptions, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """Every message of the queue at the time of the read, as record batches.

    The queue is looked up first: a missing one fails the read (or, with ``failOnMissing=false``,
    reads as empty), and a stream is refused before anything is attached.
    """
    endpoint = options.endpoint
    amqp = AmqpConnection.open(endpoint)
    try:
        if look_up(amqp, options) is None:
            return
        link = amqp.receiver(endpoint.address, copy=True, timeout=endpoint.connect_timeout_s)
        impl = link_pointer(link)
        position = 0
        while True:
            link.drain(BROWSE_WINDOW)
            builder = BatchBuilder(columns)
            received = 0
            while True:
                _, payloads, dropped = take_transfers(impl, BROWSE_WINDOW, settle=True)
                received += len(payloads) + dropped
                builder.add_numbered(payloads, position + 1)
                position += len(payloads)
                if not link.draining() and link.queued == 0:
                    break
                if not payloads and not dropped:
                    amqp.wait(
                        lambda: has_transfer(impl) or not link.draining(),
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

    def __init__(self, options: ReadOptions, schema: StructType | None = None) -> None:
        self.options = options
        self.columns = read_columns(schema)

    def partitions(self) -> list[InputPartition]:
        """A single task (its order is the queue's)."""
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Browse the whole queue in the executor."""
        return browse(self.options, self.columns)
