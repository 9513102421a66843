"""The ``sluicegate`` command line: ``serve`` runs the server, ``queues`` manages its queues,
``log`` checks and repairs its durable log, ``placement`` moves queues off workers a server no
longer has, ``quiver`` measures one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser; each subcommand's module adds its own arguments."""
    from sluicegate.cli import log as log_cli
    from sluicegate.cli import passwd as passwd_cli
    from sluicegate.cli import placement as placement_cli
    from sluicegate.cli import queues as queues_cli
    from sluicegate.cli import serve as serve_cli
    from sluicegate.clients.quiver import cli as quiver_cli

    parser = argparse.ArgumentParser(
        prog="sluicegate", description="An AMQP 1.0 message server with bounded memory."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cli.add_parser(commands)
    passwd_cli.add_parser(commands)
    queues_cli.add_parser(commands)
    log_cli.add_parser(commands)
    placement_cli.add_parser(commands)
    quiver_cli.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand named on the command line and return its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
