"""``sluicegate placement move --to-workers N DIR``: queues of workers a server no longer has,
moved to the ones it has (docs/operations.md), so that it can be served with fewer workers.

The server refuses to start when the placement file records queues on workers beyond
``--workers`` (their messages are in those workers' logs); this is the explicit step that moves
them, with their durable messages, while the server is stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sluicegate.cli.segment_size import add_segment_size, segment_size
from sluicegate.gateway.durability import DataDirLocked
from sluicegate.gateway.queue_moves import MoveRefused, move_queues
from sluicegate.queues.log.damage import LogDamaged
from sluicegate.queues.log.recovery import LogCorrupted
from sluicegate.queues.queue_homes import HomesDamaged
from sluicegate.wire.errors import DecodeError


def add_parser(commands: Any) -> None:
    """Add the ``placement`` subcommand and its ``move`` action."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "placement", help="move queues off workers a server of several no longer has"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    move = actions.add_parser(
        "move",
        help="move every queue recorded on a worker beyond N, with its durable messages, to "
        "the N workers left (the server must be stopped)",
    )
    move.add_argument("directory", type=Path, metavar="DIR", help="the server's data directory")
    move.add_argument(
        "--to-workers", type=int, required=True, metavar="N", help="the workers it will serve"
    )
    add_segment_size(move)
    move.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Move the queues; 0 once the directory can be served with ``--to-workers`` workers."""
    size = segment_size(args)
    if size is None:
        return 2
    try:
        report = move_queues(args.directory, args.to_workers, size)
    except DataDirLocked as error:
        print(f"sluicegate: {error}: stop the server first", file=sys.stderr)
        return 2
    except (MoveRefused, HomesDamaged) as error:
        print(f"sluicegate: nothing moved: {error}", file=sys.stderr)
        return 2
    except (OSError, LogCorrupted, LogDamaged, DecodeError) as error:
        print(
            f"sluicegate: the move stopped: {error}; run it again once the cause is fixed "
            "(nothing confirmed is lost: the placement changes only after the copies are "
            "fsynced)",
            file=sys.stderr,
        )
        return 2
    print("\n".join(report))
    return 0
