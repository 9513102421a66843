"""``sluicegate serve``: run the server until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.config import ConfigError, load_config
from gateway.server import Server


def add_parser(commands: Any) -> None:
    """Add the ``serve`` subcommand."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve", help="run the AMQP 1.0 server (default: 127.0.0.1:5672, no config needed)"
    )
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (port 0: any)")
    parser.add_argument("--data-dir", type=Path, metavar="DIR", help="where durable data lives")
    parser.add_argument("--config", type=Path, metavar="FILE", help="a TOML configuration file")
    parser.add_argument("--max-message-size", metavar="SIZE", help="e.g. 8MiB")
    parser.add_argument("--max-queue-credit", type=int, metavar="N")
    parser.add_argument("--max-link-credit", type=int, metavar="N")
    parser.add_argument(
        "--memory-budget", metavar="SIZE", help="message bytes held in memory, e.g. 64MiB"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the server, print where it listens, and serve until told to stop."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        config = load_config(
            args.config,
            overrides={
                "listen": args.listen,
                "data_dir": args.data_dir,
                "max_message_size": args.max_message_size,
                "max_queue_credit": args.max_queue_credit,
                "max_link_credit": args.max_link_credit,
                "memory_budget": args.memory_budget,
            },
        )
    except ConfigError as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return 2
    return serve(config)


def serve(config: Any) -> int:
    """Run a server with ``config`` in this process until SIGINT or SIGTERM."""
    server = Server(config)
    try:
        server.start()
    except OSError as error:
        print(f"sluicegate: cannot listen on {config.listen}: {error.strerror}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        server.request_shutdown()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"sluicegate listening on amqp://{config.host}:{server.port}", flush=True)
    server.run()
    return 0
