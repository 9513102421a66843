"""Arguments of ``sluicegate quiver``."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    """Add the ``quiver`` subcommand."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "quiver", help="measure throughput and latency of an AMQP 1.0 server"
    )
    parser.add_argument("url")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the measurement."""
    raise SystemExit("sluicegate quiver: not built yet")
