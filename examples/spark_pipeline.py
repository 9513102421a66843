"""An example Spark pipeline on sluicegate: orders in, large orders out, at-least-once.

Reads JSON orders from the queue ``/queues/orders`` as a stream (``mode=queue``: each message is
settled only once Spark has committed the micro-batch holding it), keeps those worth more than
``--threshold``, and sends them to ``/queues/large-orders`` with the sink. A redelivered message
(the query died before its batch committed) has ``delivery_count`` > 0; the sink's
deterministic message-ids let a consumer drop the duplicates a restart may produce.

    sluicegate serve &
    python examples/spark_pipeline.py --url amqp://127.0.0.1:5672 --checkpoint /tmp/orders-ckpt
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark import register

ORDER = "id string, customer string, amount double"


def main() -> None:
    """Run the pipeline until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://127.0.0.1:5672")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--threshold", type=float, default=1000.0)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow and proton
    spark = SparkSession.builder.master("local[2]").appName("sluicegate-orders").getOrCreate()
    register(spark)

    orders = (
        spark.readStream.format("sluicegate")
        .option("url", args.url)
        .option("address", "/queues/orders")
        .option("maxRecordsPerTrigger", "10000")
        .load()
    )
    large = (
        orders.select(
            F.from_json(F.col("body").cast("string"), ORDER).alias("order"),
            (F.col("delivery_count") > 0).alias("redelivered"),
        )
        .where(F.col("order.amount") > args.threshold)
        .select(
            F.to_json(F.col("order")).alias("body"),
            F.col("order.id").alias("correlation_id"),
            F.lit("application/json").alias("content_type"),
            F.create_map(F.lit("redelivered"), F.col("redelivered").cast("string")).alias(
                "application_properties"
            ),
        )
    )
    query = (
        large.writeStream.format("sluicegate")
        .option("url", args.url)
        .option("address", "/queues/large-orders")
        .option("checkpointLocation", args.checkpoint)
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
