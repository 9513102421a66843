"""``sluicegate serve``: run the server until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Final

from sluicegate.gateway.config import ConfigError, load_config, setting_names
from sluicegate.gateway.durability import VhostNotConfigured
from sluicegate.gateway.runtime_vhosts import RuntimeVhostsDamaged
from sluicegate.gateway.server import Server, StartError
from sluicegate.gateway.supervisor import Supervisor, WorkerChannels, layout_error
from sluicegate.queues.log.damage import LogDamaged
from sluicegate.queues.log.recovery import LogCorrupted

log = logging.getLogger("sluicegate")

_FLAG_HELP: Final = {
    "listen": "AMQP address to listen on, HOST:PORT (port 0: any)",
    "data_dir": "where durable data lives",
    "max_message_size": "largest message accepted, e.g. 8MiB",
    "metrics_listen": "Prometheus endpoint, HOST:PORT, or 'off'",
    "memory_budget": "message bytes held in memory, e.g. 64MiB",
    "workers": "worker processes on one port (docs/workers.md)",
}


def add_parser(commands: Any) -> None:
    """Add the ``serve`` subcommand."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve", help="run the AMQP 1.0 server (default: 127.0.0.1:5672, no config needed)"
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="a TOML configuration file")
    for name in setting_names(scalar=True):
        # Values stay strings here: load_config checks them like file and environment values,
        # so a bad flag gets the same one-line error naming the key.
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            metavar=name.upper(),
            help=_FLAG_HELP.get(name, "see docs/configuration.md"),
        )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the server, print where it listens, and serve until told to stop."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        flags = {name: getattr(args, name) for name in setting_names(scalar=True)}
        config = load_config(args.config, overrides=flags)
    except ConfigError as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return 2
    layout = layout_error(config)
    if layout is not None:
        print(f"sluicegate: data_dir: {layout}", file=sys.stderr)
        return 1
    if config.workers > 1:
        return Supervisor(config, serve).run()
    return serve(config)


def serve(
    config: Any,
    ready: Callable[[], None] | None = None,
    channels: WorkerChannels | None = None,
) -> int:
    """Run a server with ``config`` in this process until SIGINT or SIGTERM; a worker's
    supervisor is told it serves through ``ready`` instead of the listening lines, and hands
    it its ``channels`` to the other workers."""
    try:
        server = Server(config, channels=channels)
    except (OSError, LogCorrupted, LogDamaged, VhostNotConfigured, RuntimeVhostsDamaged) as error:
        print(
            f"sluicegate: cannot open the data directory {config.data_dir}: {error}",
            file=sys.stderr,
        )
        return 1
    try:
        server.start()
    except StartError as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return 1
    # What start-up made (modules, the recovered topology) lives as long as the process: the
    # collector leaves it alone from now on. Nothing relies on it: a closed connection, an
    # ended session or a detached link is freed by reference counting as it ends
    # (gateway/state.py), since an idle server runs no collection at all and its cycles held
    # every unsettled delivery (tests/integration/test_connection_leaks.py). It runs on the
    # reactor thread only, at Python's thresholds (gateway/collection.py): run by the thread
    # that allocated, it freed proton objects beside the reactor and the worker aborted.
    gc.freeze()
    gc.disable()

    def stop(signum: int, frame: FrameType | None) -> None:
        server.request_shutdown()
        if not watchdog:
            watchdog.append(
                threading.Thread(
                    target=_watch_shutdown, args=(server,), name="shutdown-watchdog", daemon=True
                )
            )
            watchdog[0].start()

    watchdog: list[threading.Thread] = []

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if ready is not None:
        ready()
    else:
        print(f"sluicegate listening on amqp://{config.host}:{server.port}", flush=True)
        if server.tls_port is not None:
            host = config.tls_listen.rpartition(":")[0]
            print(f"sluicegate listening on amqps://{host}:{server.tls_port}", flush=True)
    server.run()
    return server.exit_status


# How long past ``shutdown_timeout`` the watchdog waits for the reactor to stop serving: the
# reactor's select timeout (0.5 s, the most it overruns its own deadline) twice over, so a
# reactor that is only slow always gets there first.
WATCHDOG_MARGIN: Final = 1.0


def _watch_shutdown(server: Server) -> None:
    """End the process if the reactor has not stopped serving within ``shutdown_timeout``.

    The reactor acts on SIGTERM only between two events; one stuck in a loop (a bug, or work a
    client made unbounded) would otherwise make SIGTERM a no-op that only SIGKILL ends. What
    the log has fsynced is kept; the server's own shutdown would have written the rest.
    """
    if server.finishing.wait(server.config.shutdown_timeout + WATCHDOG_MARGIN):
        return
    log.error(
        "shutdown: the reactor did not stop within shutdown_timeout (%s s); exiting now",
        server.config.shutdown_timeout,
    )
    logging.shutdown()
    os._exit(1)
