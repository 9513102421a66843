"""One tenant at its quotas (issue 19): what it can make the server hold, in RSS.

A started sluicegate gets one virtual host ``tenant`` with RabbitMQ's vhost limits (queues,
connections) and sluicegate's (exchanges, bindings), and an anonymous user allowed everything
there with RabbitMQ's user limits (connections, sessions). The tenant then asks for twice each
quota over management — queues, exchanges, bindings — and opens one connection more than its
limit, each with more sessions than its share, each session with ``max_links_per_session``
links. The figures: what was granted and refused, and the server's RSS before, after the
topology and with every connection open. A server given by URL runs the same requests in its
default virtual host, with whatever limits it has (none, for an older sluicegate).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TextIO

from proton import Connection, Endpoint, Link, Session

from bench.management import Management
from bench.probes import BYTES_PER_MB
from bench.record import Record
from bench.runs import server_sampler
from bench.scenario import Scenario
from bench.series import Series
from bench.servers import Server, Target, running
from bench.table import Cell
from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver import procstat

__all__ = ["SCENARIO", "run"]

VHOST: Final[str] = "tenant"
QUEUES: Final[int] = 1000
EXCHANGES: Final[int] = 100
BINDINGS: Final[int] = 10_000
CONNECTIONS: Final[int] = 10
SESSIONS: Final[int] = 64  # RabbitMQ 4's sessions per connection, here for the whole user
LINKS: Final[int] = 256  # max_links_per_session's default
ASK: Final[int] = 2  # each quota is asked for this many times over
OPEN_TIMEOUT_S: Final[float] = 60.0
SETTLE_S: Final[float] = 2.0
COLUMNS: Final[tuple[str, ...]] = (
    "queues ok/refused",
    "exchanges ok/refused",
    "bindings ok/refused",
    "connections ok/refused",
    "sessions ok/refused",
    "links",
    "RSS start MB",
    "RSS topology MB",
    "RSS connected MB",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tenant's quotas."""
    parser.add_argument("--queues", type=int, default=QUEUES, metavar="N")
    parser.add_argument("--exchanges", type=int, default=EXCHANGES, metavar="N")
    parser.add_argument("--bindings", type=int, default=BINDINGS, metavar="N")
    parser.add_argument("--connections", type=int, default=CONNECTIONS, metavar="N")
    parser.add_argument("--sessions", type=int, default=SESSIONS, metavar="N")


def _config(args: argparse.Namespace) -> str:
    return (
        f"[vhosts.{VHOST}]\nmax_queues = {args.queues}\nmax_exchanges = {args.exchanges}\n"
        f"max_bindings = {args.bindings}\nmax_connections = {args.connections}\n"
        f"[users.anonymous]\nmax_connections = {args.connections}\n"
        f"max_sessions = {args.sessions}\n[users.anonymous.permissions.{VHOST}]\n"
    )


def _rss(server: Server) -> float | None:
    sample = None if server.pid is None else procstat.sample(server.pid)
    return None if sample is None else sample.rss_bytes / BYTES_PER_MB


def _topology(management: Management, args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """Ask for ``ASK`` times each quota; count what was granted and what refused."""
    granted = {"queues": 0, "exchanges": 0, "bindings": 0}
    asked = {"queues": ASK * args.queues, "exchanges": ASK * args.exchanges}
    asked["bindings"] = ASK * args.bindings
    for index in range(asked["queues"]):
        body: dict[str, object] = {"durable": False}
        granted["queues"] += management.reply("PUT", f"/queues/q-{index}", body)[0] < 300
    for index in range(asked["exchanges"]):
        body = {"type": "direct", "durable": False}
        granted["exchanges"] += management.reply("PUT", f"/exchanges/x-{index}", body)[0] < 300
    queues = max(granted["queues"], 1)
    for index in range(asked["bindings"]):
        body = {
            "source": "amq.direct",
            "destination_queue": f"q-{index % queues}",
            "binding_key": f"k-{index}",
        }
        granted["bindings"] += management.reply("POST", "/bindings", body)[0] < 300
    return {kind: (granted[kind], asked[kind] - granted[kind]) for kind in granted}


def _pump_until(pumps: list[Pump], done: Sequence[Connection | Session | Link]) -> None:
    """Move bytes until every endpoint in ``done`` is answered (opened or closed) or time ends."""
    deadline = time.monotonic() + OPEN_TIMEOUT_S
    while time.monotonic() < deadline:
        live = [pump for pump in pumps if not pump.closed]
        for pump in live:
            pump.pump(0.0)
        if all(endpoint.state & Endpoint.REMOTE_UNINIT == 0 for endpoint in done):
            return
        time.sleep(0.01)


def _connect(server: Server, args: argparse.Namespace, hostname: str) -> tuple[list[Pump], int]:
    pumps = []
    for index in range(args.connections + 1):
        sock = socket.create_connection((server.host, server.port), timeout=OPEN_TIMEOUT_S)
        pump = Pump.client(sock, f"tenant-{index}", hostname)
        pump.connection.open()
        pumps.append(pump)
    _pump_until(pumps, [pump.connection for pump in pumps])
    opened = [pump for pump in pumps if not pump.connection.state & Endpoint.REMOTE_CLOSED]
    return opened, len(pumps) - len(opened)


def _sessions(pumps: list[Pump], args: argparse.Namespace, queues: int) -> tuple[int, int, int]:
    """Open more sessions than the user may have, each with ``LINKS`` sender links."""
    per_connection = args.sessions // max(len(pumps), 1) + 1
    sessions: list[Session] = []
    for pump in pumps:
        for _ in range(per_connection):
            session = pump.connection.session()
            session.open()
            sessions.append(session)
    _pump_until(pumps, sessions)
    kept = [s for s in sessions if not s.state & Endpoint.REMOTE_CLOSED]
    links: list[Link] = []
    for number, session in enumerate(kept):
        for index in range(LINKS):
            sender = session.sender(f"s{number}-{index}")
            sender.target.address = f"/queues/q-{index % max(queues, 1)}"
            sender.open()
            links.append(sender)
    _pump_until(pumps, links)
    attached = sum(1 for link in links if not link.state & Endpoint.REMOTE_CLOSED)
    return len(kept), len(sessions) - len(kept), attached


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Fill the quotas, sampling the server's RSS, then close everything."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-tenant-") as scratch:
        config = Path(scratch) / "tenant.toml"
        config.write_text(_config(args))
        with running(target, ["--config", str(config)]) as server:
            hostname = f"vhost:{VHOST}" if target.started else server.host
            print(f"{target.name}: one tenant asks for {ASK}x its quotas", file=out, flush=True)
            figures, series = _fill(server, args, hostname)
    return [
        Record(
            server=target.name,
            case="quotas" if target.started else "its own limits",
            parameters={
                "queues": args.queues,
                "exchanges": args.exchanges,
                "bindings": args.bindings,
                "connections": args.connections,
                "sessions": args.sessions,
                "links_per_session": LINKS,
                "asked": ASK,
            },
            figures=figures,
            series=series,
        )
    ]


def _fill(
    server: Server, args: argparse.Namespace, hostname: str
) -> tuple[dict[str, Cell], dict[str, Series]]:
    sampler = server_sampler(server)
    sampler.start()
    start = _rss(server)
    with Management(server.host, server.port, hostname) as management:
        topology = _topology(management, args)
    time.sleep(SETTLE_S)
    after_topology = _rss(server)
    pumps, refused = _connect(server, args, hostname)
    sessions, sessions_refused, links = _sessions(pumps, args, topology["queues"][0])
    time.sleep(SETTLE_S)
    for pump in pumps:
        pump.pump(0.0)
    connected = _rss(server)
    for pump in pumps:
        pump.connection.close()
        pump.pump(0.1)
        pump.close()
    figures: dict[str, Cell] = {
        f"{kind} ok/refused": f"{ok:,}/{no:,}" for kind, (ok, no) in topology.items()
    }
    figures["connections ok/refused"] = f"{len(pumps)}/{refused}"
    figures["sessions ok/refused"] = f"{sessions}/{sessions_refused}"
    figures["links"] = links
    figures["RSS start MB"] = start
    figures["RSS topology MB"] = after_topology
    figures["RSS connected MB"] = connected
    return figures, sampler.stop()


SCENARIO: Final = Scenario(
    name="tenant",
    help="one tenant asks for twice its vhost and user quotas: what is granted, and RSS",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
