"""One local Spark (``local[2]``) for every connector test, and helpers to drive it.

A SparkSession costs about 5 s to start and the first Python data source use 5 s more
(docs/spark.md), so the session is shared; each test uses its own queue names and
checkpoint directories. ``PYSPARK_PYTHON`` makes Spark's Python workers this interpreter, the one
with pyarrow and the project installed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from sluicegate.spark import register


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The shared session, with the ``sluicegate`` format registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sluicegate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    # Spark gives a new Python worker 10 s to connect back, a limit it does not let us raise;
    # a first job warms the page cache with pyspark's and pyarrow's imports, so that on a loaded
    # machine the first streaming runner does not miss it.
    session.sparkContext.parallelize(range(2), 2).map(
        lambda n: (__import__("pyspark.sql.datasource"), __import__("pyarrow"), n)[2]
    ).collect()
    yield session
    session.stop()


def wait_for(query: StreamingQuery, predicate: Callable[[], bool], timeout: float = 240.0) -> None:
    """Poll ``predicate`` while ``query`` runs; fail at once with its error if it dies."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if not query.isActive:
            pytest.fail(f"the query ended: {query.exception()}")
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s; last progress {query.lastProgress}")
        time.sleep(0.2)
