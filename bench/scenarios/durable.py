"""Durable throughput: the throughput run with durable messages into a durable queue.

Issue 7's figure: one sender and one receiver at credit 100,000, 100-byte messages, target
≥ 10,000 msg/s end to end. On a sluicegate the bench started, the run must leave a log under
the server's data directory; if it does not, durable queues are missing and the run says so
instead of reporting in-memory figures as durable ones.
"""

from __future__ import annotations

import argparse
from typing import Final, TextIO

from bench.record import Record
from bench.scenario import Scenario
from bench.scenarios import throughput
from bench.servers import MissingFeature, Server, Target

__all__ = ["SCENARIO", "check_written", "run"]

DEFAULT_CREDITS: Final[tuple[int, ...]] = (100_000,)


def check_written(server: Server) -> None:
    """``MissingFeature`` unless a server the bench started wrote bytes under its data dir."""
    data_dir = server.data_dir
    if data_dir is None:
        return  # a server given by URL keeps its data where it likes
    files = data_dir.rglob("*") if data_dir.exists() else iter(())
    if sum(f.stat().st_size for f in files if f.is_file()) == 0:
        raise MissingFeature(
            "durable queues (issue 7) are missing: the server wrote nothing under its data "
            "directory for durable messages"
        )


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """One durable quiver run per credit window."""
    return [
        throughput.measure(
            target,
            credit,
            args.duration,
            args.body_size,
            out,
            "durable",
            durable=True,
            check=check_written,
        )
        for credit in args.credit or DEFAULT_CREDITS
    ]


SCENARIO: Final = Scenario(
    name="durable",
    help="quiver with durable messages at credit 100,000 (needs durable queues)",
    columns=throughput.COLUMNS,
    add_arguments=throughput.add_arguments,
    run=run,
)
