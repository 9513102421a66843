"""The sluicegate PySpark data source: ``format("sluicegate")`` for reads, streams and writes.

``register(spark)`` makes the short name known to a session::

    from sluicegate.spark import register
    register(spark)
    spark.readStream.format("sluicegate").option("url", "amqp://127.0.0.1:5672") \
        .option("address", "/queues/orders").load()
"""

from __future__ import annotations

from typing import Any

from sluicegate.spark.source import SluicegateDataSource

__all__ = ["SluicegateDataSource", "register"]


def register(session: Any) -> None:
    """Register the data source with a ``SparkSession``."""
    session.dataSource.register(SluicegateDataSource)
