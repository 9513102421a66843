"""``sluicegate log check DIR`` and ``sluicegate log repair DIR``: the operator's view of a log.

The server refuses to start on a log with damage a crash cannot explain; these commands say
what is wrong (``check``, which changes nothing) and cut it away (``repair``, which says
exactly what it dropped). DIR is a data directory (its ``log/``) or a log directory itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sluicegate.cli.segment_size import add_segment_size, segment_size
from sluicegate.gateway.durability import LOG_DIRECTORY, DataDirLocked, lock_data_dir
from sluicegate.queues.log.check import check, repair
from sluicegate.queues.log.damage import LogDamaged
from sluicegate.queues.log.recovery import LogCorrupted
from sluicegate.queues.log.segments import list_segments
from sluicegate.wire.errors import DecodeError


def add_parser(commands: Any) -> None:
    """Add the ``log`` subcommand and its ``check`` and ``repair`` actions."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "log", help="check or repair a durable log (the server refuses a damaged one)"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    for name, help_text in (
        ("check", "report each segment and any damage; change nothing (exit 1 if damaged)"),
        ("repair", "cut every damage away and say exactly what that dropped"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("directory", type=Path, metavar="DIR", help="data or log directory")
        add_segment_size(
            action, "the server's log_segment_size (a larger segment file is refused unread)"
        )
        action.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check or repair the log; 0 when the server can start on it afterwards."""
    size = segment_size(args)
    if size is None:
        return 2
    try:
        return _run(args, size)
    except (OSError, LogCorrupted, LogDamaged, DecodeError) as error:
        print(f"sluicegate: cannot {args.action} the log: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, segment_size: int) -> int:
    data_dir: Path = args.directory
    directory = data_dir / LOG_DIRECTORY if (data_dir / LOG_DIRECTORY).is_dir() else data_dir
    if not list_segments(directory):
        print(f"sluicegate: no log segments in {directory}", file=sys.stderr)
        return 2
    if args.action == "check":
        report = check(directory, segment_size)
    else:
        try:
            lock = lock_data_dir(directory.parent)
        except DataDirLocked as error:
            print(f"sluicegate: {error}", file=sys.stderr)
            return 2
        try:
            report = repair(directory, segment_size)
        finally:
            lock.close()
    print("\n".join(report.lines()))
    return 0 if report.startable or (report.repaired and not report.left) else 1
