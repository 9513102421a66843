"""``--log-segment-size``: the option of the offline log tools (``log``, ``placement``) that
says how large the server's segments may be, so that they read its log as it would."""

from __future__ import annotations

import argparse
import sys

from sluicegate.gateway.config import ConfigError, parse_size
from sluicegate.queues.log.store import DEFAULT_SEGMENT_SIZE

__all__ = ["add_segment_size", "segment_size"]


def add_segment_size(
    parser: argparse.ArgumentParser, help_text: str = "the server's log_segment_size"
) -> None:
    """Add ``--log-segment-size SIZE`` (the server's default unless given) to ``parser``."""
    parser.add_argument(
        "--log-segment-size", metavar="SIZE", default=str(DEFAULT_SEGMENT_SIZE), help=help_text
    )


def segment_size(args: argparse.Namespace) -> int | None:
    """The size ``--log-segment-size`` gave in bytes; None, said on stderr, when it is no size."""
    try:
        return parse_size("--log-segment-size", args.log_segment_size)
    except ConfigError as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return None
