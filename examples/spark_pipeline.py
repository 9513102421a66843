"""An example Spark pipeline on sluicegate: orders in, large orders out, at-least-once.

Reads JSON orders from the queue ``/queues/orders`` as a stream (``mode=queue``: each message is
settled only once Spark has committed the micro-batch holding it), keeps those worth more than
``--threshold``, and sends them to ``/queues/large-orders`` with the sink. Each large order keeps
its order's message-id, so a consumer drops the rare duplicate a crash leaves by id; whether the
order may have been processed before (``redelivered``) travels as a boolean application
property. Nothing is filtered on ``redelivered``: a redelivered order may never have been
processed.

    sluicegate serve &
    python examples/spark_pipeline.py --url amqp://127.0.0.1:5672 --checkpoint /tmp/orders-ckpt

Against a gateway that wants a password over TLS (docs/spark.md), the password comes from the
environment, never the command line (which other users of the machine can read)::

    SLUICEGATE_PASSWORD=... python examples/spark_pipeline.py --url amqps://gw.example \
        --user etl --ca-file /etc/ssl/sluicegate-ca.pem --max-bytes 16000000 --checkpoint /tmp/c
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluicegate.spark import register

ORDER = "id string, customer string, amount double"
PASSWORD_VARIABLE = "SLUICEGATE_PASSWORD"


def connection_options(args: argparse.Namespace) -> dict[str, str]:
    """The url and, if given, the login and the CA bundle: the same for the source and sink."""
    options = {"url": args.url}
    if args.user is not None:
        password = os.environ.get(PASSWORD_VARIABLE)
        if password is None:
            sys.exit(f"--user {args.user}: set the password in ${PASSWORD_VARIABLE}")
        options.update(username=args.user, password=password)
    if args.ca_file is not None:
        options["tlsCaFile"] = args.ca_file
    return options


def main() -> None:
    """Run the pipeline until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://127.0.0.1:5672")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--threshold", type=float, default=1000.0)
    parser.add_argument("--user", help=f"SASL PLAIN user; the password is in ${PASSWORD_VARIABLE}")
    parser.add_argument("--ca-file", help="PEM CAs to verify an amqps:// gateway with")
    parser.add_argument(
        "--max-bytes", default="16000000", help="maxBytesPerTrigger: bytes per micro-batch"
    )
    args = parser.parse_args()
    connection = connection_options(args)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow and proton
    spark = SparkSession.builder.master("local[2]").appName("sluicegate-orders").getOrCreate()
    register(spark)

    orders = (
        spark.readStream.format("sluicegate")
        .options(**connection)
        .option("address", "/queues/orders")
        .option("maxRecordsPerTrigger", "10000")
        .option("maxBytesPerTrigger", args.max_bytes)
        .load()
    )
    large = (
        orders.select(
            "message_id",
            "redelivered",
            F.from_json(F.col("body").cast("string"), ORDER).alias("order"),
        )
        .where(F.col("order.amount") > args.threshold)
        .select(
            F.to_json(F.col("order")).alias("body"),
            "message_id",
            F.col("order.id").alias("correlation_id"),
            F.lit("application/json").alias("content_type"),
            F.create_map(F.lit("redelivered"), F.col("redelivered")).alias(
                "application_properties"
            ),
        )
    )
    query = (
        large.writeStream.format("sluicegate")
        .options(**connection)
        .option("address", "/queues/large-orders")
        .option("checkpointLocation", args.checkpoint)
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
