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
    """Register the data source with a ``SparkSession``, knowing its default parallelism.

    ``minPartitions`` defaults to Spark's default parallelism, which only the session knows:
    the class registered carries it to the processes that plan reads (a class made here is
    pickled with its attributes). Registering ``SluicegateDataSource`` directly works too, with
    the planner host's CPU count as the default instead.
    """
    try:
        parallelism: int | None = int(session.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: fall back to the CPU count
        parallelism = None
    source = type(
        SluicegateDataSource.__name__,
        (SluicegateDataSource,),
        {"default_parallelism": parallelism, "__module__": SluicegateDataSource.__module__},
    )
    session.dataSource.register(source)
