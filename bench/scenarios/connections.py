"""Many connections: open N, each with a sender and a receiver, then exchange messages on all.

What a broker pays per connection (RSS with all open, divided by N), how long opening them takes
(proton's reactor listens with a backlog of 10 and selects over at most 1,024 file descriptors:
docs/design.md), and the rate when every connection sends and receives at once.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Final, TextIO

from bench.clients import ClientError
from bench.fleet import GO, Finished, FleetPlan, Opened, run_fleet
from bench.probes import BYTES_PER_MB
from bench.record import Record
from bench.runs import server_sampler, unique_queue
from bench.scenario import Scenario
from bench.series import Series, extent
from bench.servers import Target, running
from bench.table import Cell

__all__ = ["SCENARIO", "run"]

CONNECTIONS: Final[int] = 1000  # near select()'s 1,024 descriptors, which the epoll reactor lifts
MESSAGES: Final[int] = 50  # per connection: 50,000 in all
BODY_SIZE: Final[int] = 100
SETTLE_S: Final[float] = 2.0  # idle time with everything open, for a steady RSS reading
REPLY_TIMEOUT_S: Final[float] = 400.0  # the fleet's own phase timeout plus connecting
COLUMNS: Final[tuple[str, ...]] = (
    "connections",
    "open s",
    "KB/connection",
    "messages",
    "exchange s",
    "msg/s",
    "RSS peak MB",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--connections, --messages (per connection), --body-size."""
    parser.add_argument("--connections", type=int, default=CONNECTIONS, metavar="N")
    parser.add_argument("--messages", type=int, default=MESSAGES, metavar="M")
    parser.add_argument("--body-size", type=int, default=BODY_SIZE, metavar="B")


def _reply(channel: multiprocessing.connection.Connection, what: str) -> object:
    if not channel.poll(REPLY_TIMEOUT_S):
        raise ClientError(f"fleet: no answer while {what} after {REPLY_TIMEOUT_S:g} s")
    reply: object = channel.recv()
    if isinstance(reply, str):
        raise ClientError(f"fleet: {reply}")
    return reply


def _rss_at(series: Series | None, t: float) -> float | None:
    if series is None:
        return None
    before = [v for when, v in series.points if when <= t]
    return before[-1] if before else None


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Open, hold still, exchange, close: RSS sampled throughout."""
    context = multiprocessing.get_context("spawn")
    with running(target) as server:
        plan = FleetPlan(
            server.host,
            server.port,
            server.address(unique_queue("conn") + "-"),
            args.connections,
            args.messages,
            args.body_size,
        )
        sampler = server_sampler(server)
        ours, theirs = context.Pipe()
        fleet = context.Process(target=run_fleet, args=(plan, theirs), name="fleet", daemon=True)
        print(f"{target.name}: opening {args.connections:,} connections", file=out, flush=True)
        sampler.start()
        time.sleep(SETTLE_S)  # the idle server's RSS
        idle_at = sampler.elapsed()
        fleet.start()
        try:
            opened = _reply(ours, "opening connections")
            assert isinstance(opened, Opened)
            time.sleep(SETTLE_S)
            open_at = sampler.elapsed()
            print(f"{target.name}: exchanging {args.messages:,} messages on each", file=out)
            ours.send(GO)
            finished = _reply(ours, "exchanging messages")
            assert isinstance(finished, Finished)
            ours.send(GO)
        finally:
            fleet.join(SETTLE_S * 5)
            if fleet.is_alive():
                fleet.terminate()
        series = sampler.stop()
    rss = series.get("server RSS")
    idle, held = _rss_at(rss, idle_at), _rss_at(rss, open_at)
    per_connection = (
        None
        if idle is None or held is None
        else (held - idle) * BYTES_PER_MB / 1024 / plan.connections
    )
    total = plan.connections * plan.messages
    peak = extent(rss.points) if rss else None
    figures: dict[str, Cell] = {
        "connections": plan.connections,
        "open s": opened.seconds,
        "KB/connection": per_connection,
        "messages": finished.received,
        "exchange s": finished.seconds,
        "msg/s": total / finished.seconds if finished.seconds > 0 else None,
        "RSS peak MB": None if peak is None else peak.peak,
    }
    return [
        Record(
            server=target.name,
            case=f"{plan.connections:,} connections",
            parameters={
                "connections": plan.connections,
                "messages_per_connection": plan.messages,
                "body_size": plan.body_size,
            },
            figures=figures,
            series=series,
        )
    ]


SCENARIO: Final = Scenario(
    name="connections",
    help="1,000 connections, each a sender and a receiver: open time, KB per connection, rate",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
