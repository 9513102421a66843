"""The ``sluicegate`` PySpark data source: which reader or writer each kind of use gets.

Spark builds this object in several processes and pickles what it returns (docs/spark.md),
so nothing here connects: options are validated, readers and writers are plain values, and the
connections are opened where the work happens (the streaming runner, the executors).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from sluicegate.spark.browse import BrowseReader
from sluicegate.spark.options import (
    Mode,
    OptionError,
    ReadOptions,
    parse_read_options,
    parse_write_options,
)
from sluicegate.spark.queue_source import QueueStreamReader
from sluicegate.spark.records import SCHEMA
from sluicegate.spark.sink import SinkStreamWriter, SinkWriter, check_sink_schema
from sluicegate.spark.stream_source import StreamOffsetReader, StreamRangeReader


class SluicegateDataSource(DataSource):
    """``spark.readStream.format("sluicegate").option("url", ...).option("address", ...)``."""

    # Spark's default parallelism, the default of minPartitions: ``spark.register`` records
    # the session's in the class it registers (the planner processes cannot ask the session).
    default_parallelism: ClassVar[int | None] = None

    @classmethod
    def name(cls) -> str:
        """The short name for ``format()``."""
        return "sluicegate"

    def schema(self) -> StructType:
        """Every read has the same columns (``spark.records.SCHEMA``); a read may ask for fewer."""
        return SCHEMA

    def _read_options(self, streaming: bool) -> ReadOptions:
        options = parse_read_options(self.options, streaming=streaming)
        if options.min_partitions is None:
            parallelism = self.default_parallelism or os.cpu_count() or 1
            options = dataclasses.replace(options, min_partitions=parallelism)
        return options

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read: ``mode=browse`` copies a queue, ``mode=stream`` reads offsets."""
        options = self._read_options(streaming=False)
        if options.mode is Mode.BROWSE:
            return BrowseReader(options, schema)
        return StreamRangeReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``mode=queue``: the runner holds the link, executors decode; ``mode=stream``: ranges."""
        options = self._read_options(streaming=True)
        if options.mode is Mode.QUEUE:
            return QueueStreamReader(options, schema)
        return StreamOffsetReader(options, schema)

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
