"""The ``sluicegate`` PySpark data source: which reader or writer each kind of use gets.

Spark builds this object in several processes and pickles what it returns (docs/spark.md),
so nothing here connects: options are validated, readers and writers are plain values, and the
connections are opened where the work happens (the streaming runner, the executors).
"""

from __future__ import annotations

import uuid

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from sluicegate.spark.browse import BrowseReader
from sluicegate.spark.options import Mode, OptionError, parse_read_options, parse_write_options
from sluicegate.spark.queue_source import QueueStreamReader
from sluicegate.spark.records import SCHEMA
from sluicegate.spark.sink import SinkStreamWriter, SinkWriter, check_sink_schema
from sluicegate.spark.stream_source import StreamOffsetReader, StreamRangeReader


class SluicegateDataSource(DataSource):
    """``spark.readStream.format("sluicegate").option("url", ...).option("address", ...)``."""

    @classmethod
    def name(cls) -> str:
        """The short name for ``format()``."""
        return "sluicegate"

    def schema(self) -> StructType:
        """Every read has the same columns (``spark.records.SCHEMA``)."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read: ``mode=browse`` copies a queue."""
        options = parse_read_options(self.options, streaming=False)
        if options.mode is Mode.BROWSE:
            return BrowseReader(options)
        return StreamRangeReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``mode=stream``: offset ranges planned by the runner, read by the executors.

        ``mode=queue`` needs the simple reader (its ``read`` runs in the runner, which holds the
        link); Spark falls back to :meth:`simpleStreamReader` on ``NotImplemented``.
        """
        options = parse_read_options(self.options, streaming=True)
        if options.mode is Mode.QUEUE:
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return StreamOffsetReader(options)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        """``mode=queue``: the driver-held receiver."""
        options = parse_read_options(self.options, streaming=True)
        if options.mode is not Mode.QUEUE:
            raise OptionError(f"option mode: {options.mode.value} has no simple stream reader")
        return QueueStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch write; ``overwrite`` is meaningless for a queue and refused."""
        if overwrite:
            raise OptionError("sluicegate sink: a queue cannot be overwritten; use mode append")
        return SinkWriter(
            parse_write_options(self.options, streaming=False),
            check_sink_schema(schema),
            uuid.uuid4().hex,
        )

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming write; ids come from the query and batch (``spark.sink``)."""
        return SinkStreamWriter(
            parse_write_options(self.options, streaming=True),
            check_sink_schema(schema),
            uuid.uuid4().hex,
        )
