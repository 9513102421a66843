"""Arguments of ``sluicegate quiver``, and what it prints and writes.

Human output (status rows, CONFIGURATION and RESULTS) goes to stdout, except with ``--json`` and
no ``--output``: then stdout carries the JSON document alone and the human output goes to
stderr. Errors are one line on stderr: exit status 2 for bad arguments, 1 for a failed run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Final, TextIO

from proton import VERSION

from sluicegate.clients.quiver import native
from sluicegate.clients.quiver.endpoint import DEFAULT_PORT, UrlError, parse_url
from sluicegate.clients.quiver.runner import RunError, measure
from sluicegate.clients.quiver.settings import (
    DEFAULT_BODY_SIZE,
    DEFAULT_COUNT,
    DEFAULT_CREDIT,
    DEFAULT_TIMEOUT,
    IMPLS,
    Settings,
    SettingsError,
)
from sluicegate.clients.quiver.stats import (
    Results,
    render_configuration,
    render_results,
    summary_document,
)

__all__ = ["add_parser", "run"]

PROG: Final[str] = "sluicegate quiver"
IMPLEMENTATION: Final[str] = "python-qpid-proton {}.{}.{}".format(*VERSION)
IMPLEMENTATIONS: Final[dict[str, str]] = {"python": IMPLEMENTATION, "c": native.IMPLEMENTATION}
EXIT_FAILED: Final[int] = 1
EXIT_USAGE: Final[int] = 2  # argparse's status for bad arguments
EXIT_INTERRUPTED: Final[int] = 130  # 128 + SIGINT, as shells report it

EPILOG: Final[str] = f"""\
URL: [amqp:]//HOST[:PORT]/ADDRESS, port {DEFAULT_PORT} by default. The AMQP address is the path
without its leading slash (amqp://h/q1 -> q1), except /queues/..., /exchanges/... (RabbitMQ 4)
and /queue/..., /exchange/..., /topic/..., /amq/queue/... (RabbitMQ 3), kept whole.
Peer to peer, receiver i listens on HOST:PORT+i and sender i connects to it.
Without --count or --duration: --count {DEFAULT_COUNT:,}.
"""


def _positive_int(text: str) -> int:
    value = int(text.replace(",", "").replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def add_parser(commands: Any) -> None:
    """Add the ``quiver`` subcommand."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "quiver",
        help="measure throughput and latency of an AMQP 1.0 server",
        description="Send and receive through an AMQP 1.0 server from separate processes and "
        "report rates and latency, the way quiver does.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", metavar="URL", help="where to send and receive (see below)")
    ends = parser.add_mutually_exclusive_group()
    ends.add_argument("--count", type=_positive_int, metavar="N", help="send N messages in all")
    ends.add_argument("--duration", type=float, metavar="S", help="send for S seconds")
    parser.add_argument(
        "--body-size", type=int, default=DEFAULT_BODY_SIZE, metavar="B", help="body bytes"
    )
    parser.add_argument(
        "--credit",
        type=_positive_int,
        default=DEFAULT_CREDIT,
        metavar="C",
        help="each receiver's credit window",
    )
    parser.add_argument("--durable", action="store_true", help="send durable messages")
    parser.add_argument("--presettled", action="store_true", help="send settled (at most once)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help="fail after S seconds without progress",
    )
    parser.add_argument("--senders", type=_positive_int, default=1, metavar="K")
    parser.add_argument("--receivers", type=_positive_int, default=1, metavar="K")
    parser.add_argument("--output", metavar="DIR", help="write summary.txt (and summary.json)")
    parser.add_argument("--json", action="store_true", help="write the summary as JSON")
    parser.add_argument(
        "--peer-to-peer", action="store_true", help="no server: the receivers listen on the URL"
    )
    parser.add_argument(
        "--impl",
        choices=IMPLS,
        default="python",
        help="the senders' and receivers' language; c is built on first use and needs "
        f"{native.PACKAGE} (default: python)",
    )
    parser.set_defaults(run=run)


def settings_from(args: argparse.Namespace) -> Settings:
    """Check the URL and the options together; raise ``UrlError`` or ``SettingsError``."""
    count: int | None = args.count
    if count is None and args.duration is None:
        count = DEFAULT_COUNT
    return Settings(
        url=args.url,
        endpoint=parse_url(args.url),
        count=count,
        duration=args.duration,
        body_size=args.body_size,
        credit=args.credit,
        durable=args.durable,
        presettled=args.presettled,
        timeout=args.timeout,
        senders=args.senders,
        receivers=args.receivers,
        peer_to_peer=args.peer_to_peer,
        output=args.output,
        json_summary=args.json,
        impl=args.impl,
    )


def _error(message: str, status: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    """Run the measurement and print or write its summary; return the exit status."""
    try:
        settings = settings_from(args)
    except (UrlError, SettingsError) as error:
        return _error(str(error), EXIT_USAGE)
    if settings.output is not None:
        try:
            os.makedirs(settings.output, exist_ok=True)
        except OSError as error:
            return _error(f"cannot create {settings.output}: {error.strerror}", EXIT_FAILED)
    human = sys.stderr if settings.json_summary and settings.output is None else sys.stdout
    try:
        results = measure(settings, human)
    except RunError as error:
        return _error(str(error), EXIT_FAILED)
    except KeyboardInterrupt:
        return _error("interrupted", EXIT_INTERRUPTED)
    write_summary(settings, results, human)
    if results.accepted is not None and results.accepted < results.sent:
        return _error(
            f"the server accepted {results.accepted:,} of {results.sent:,} messages", EXIT_FAILED
        )
    return 0


def write_summary(settings: Settings, results: Results, human: TextIO) -> None:
    """Print the text blocks; write them and the JSON where asked."""
    implementation = IMPLEMENTATIONS[settings.impl]
    text = f"{render_configuration(settings, implementation)}\n\n{render_results(results)}\n"
    print(f"\n{text}", file=human, end="", flush=True)
    document = json.dumps(summary_document(settings, implementation, results), indent=2) + "\n"
    if settings.output is not None:
        with open(os.path.join(settings.output, "summary.txt"), "w") as file:
            file.write(text)
        if settings.json_summary:
            with open(os.path.join(settings.output, "summary.json"), "w") as file:
                file.write(document)
    elif settings.json_summary:
        sys.stdout.write(document)
        sys.stdout.flush()
