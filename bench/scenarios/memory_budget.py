"""Unthrottled publisher against the memory budget (issue 5): a fast sender, a slow consumer.

A sender publishes as fast as the server grants credit, and a consumer with credit 100,000 takes
500 msg/s, for 60 s, with the server started as ``--memory-budget 64MiB``. Target: RSS flat in the
second half (slope ≈ 0) and peak ≤ base + budget + 64 MiB; the publisher is held back (its
blocked time) instead of the server growing. Servers given by URL run without the option: the
comparison shows what they do without a budget.
"""

from __future__ import annotations

import argparse
import time
from typing import Final, TextIO

from bench.clients import ConsumerPlan, ConsumerProcess, SenderProcess
from bench.probes import BUDGET_GAUGES
from bench.record import Record
from bench.runs import counter_probe, rate_series, server_sampler, unique_queue
from bench.scenario import Scenario
from bench.series import Series, extent, idle_time, second_half, slope
from bench.servers import Target, running
from bench.table import Cell
from sluicegate.clients.quiver.stats import NS_PER_S

__all__ = ["SCENARIO", "publisher_figures", "run"]

BUDGET: Final[str] = "64MiB"  # issue 5's figure
BODY_SIZE: Final[int] = 1024
CREDIT: Final[int] = 100_000
RATE: Final[float] = 500.0
DURATION_S: Final[float] = 60.0
SETTLE_TIMEOUT_S: Final[float] = 120.0  # outcomes of what was sent before the end
DRAIN_S: Final[float] = SETTLE_TIMEOUT_S  # the drainer outlives the wait for those outcomes
COLUMNS: Final[tuple[str, ...]] = (
    "sent",
    "accepted",
    "taken",
    "RSS start MB",
    "RSS peak MB",
    "RSS end MB",
    "slope 2nd half MB/s",
    "budget used peak MB",
    "publisher blocked s",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Issue 5's figures, adjustable."""
    parser.add_argument("--memory-budget", default=BUDGET, metavar="SIZE")
    parser.add_argument("--body-size", type=int, default=BODY_SIZE, metavar="B")
    parser.add_argument("--credit", type=int, default=CREDIT, metavar="C")
    parser.add_argument("--rate", type=float, default=RATE, metavar="MSG/S")
    parser.add_argument("--duration", type=float, default=DURATION_S, metavar="S")


def publisher_figures(
    series: dict[str, Series], sent: int, accepted: int, taken: int, publishing: tuple[float, float]
) -> dict[str, Cell]:
    """The table row: counts, RSS extent and late slope, time the publisher made no progress.

    Blocked time counts only within ``publishing`` (from the publisher's first send to the end
    of its duration), not its start-up nor the wait for the last outcomes after it.
    """
    rss = series.get("server RSS")
    rss_extent = extent(rss.points) if rss else None
    late = slope(second_half(rss.points)) if rss else None
    published = series.get("publisher sent")
    # While the publisher runs: the drainer that collects its last outcomes afterwards is a
    # second consumer, whose transfers on their way out the budget counts too.
    used = series.get("budget used")
    used_extent = (
        extent([p for p in used.points if publishing[0] <= p[0] <= publishing[1]]) if used else None
    )
    return {
        "sent": sent,
        "accepted": accepted,
        "taken": taken,
        "RSS start MB": None if rss_extent is None else rss_extent.start,
        "RSS peak MB": None if rss_extent is None else rss_extent.peak,
        "RSS end MB": None if rss_extent is None else rss_extent.end,
        "slope 2nd half MB/s": late,
        "budget used peak MB": None if used_extent is None else used_extent.peak,
        "publisher blocked s": None
        if published is None
        else idle_time([p for p in published.points if publishing[0] <= p[0] <= publishing[1]]),
    }


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Publish and consume for the duration, sampling RSS and both clients' counters."""
    queue = unique_queue("budget")
    options = ["--memory-budget", args.memory_budget]
    with running(target, options, metrics=True) as server:
        sampler = server_sampler(server, BUDGET_GAUGES)
        address = server.address(queue)
        publisher = SenderProcess(
            server.host, server.port, address, body_size=args.body_size, duration=args.duration
        )
        consumer = ConsumerProcess(
            ConsumerPlan(
                server.host, server.port, (address,), args.credit, args.rate, args.duration
            )
        )
        for name, read in (
            ("publisher sent", lambda: publisher.sent),
            ("consumer taken", lambda: consumer.taken),
        ):
            probe, units = counter_probe(name, read)
            sampler.add(probe, units)
        budget = f" (budget {args.memory_budget})" if target.started else ""
        print(
            f"{target.name}{budget}: unthrottled publisher, consumer at {args.rate:g} msg/s, "
            f"{args.duration:g} s",
            file=out,
            flush=True,
        )
        sampler.start()
        consumer.start()
        publisher.start()
        drainer: ConsumerProcess | None = None
        clock = (time.time_ns(), sampler.elapsed())  # the sender stamps wall-clock times
        try:
            while not consumer.poll():
                publisher.poll()
                consumer.channel.poll(0.2)
            # The publisher's last messages may sit unread behind an exhausted budget, which
            # holds the publishers that fill it (docs/inbound-flow-control.md): a drainer frees
            # the budget so their outcomes come back. Its messages are not counted as taken.
            drainer = ConsumerProcess(
                ConsumerPlan(server.host, server.port, (address,), args.credit, None, DRAIN_S)
            ).start()
            done = publisher.wait(SETTLE_TIMEOUT_S)
        finally:
            publisher.stop()
            consumer.stop()
            if drainer is not None:
                drainer.stop()
        series = sampler.stop()
    first = 0.0 if done.first_ns is None else clock[1] + (done.first_ns - clock[0]) / NS_PER_S
    publishing = (first, first + args.duration)
    figures = publisher_figures(series, done.sent, done.accepted, consumer.taken, publishing)
    rate_series(series, "publisher sent", "publisher rate")
    rate_series(series, "consumer taken", "consumer rate")
    return [
        Record(
            server=target.name,
            case=f"budget {args.memory_budget}" if target.started else "no budget option",
            parameters={
                "memory_budget": args.memory_budget if target.started else None,
                "body_size": args.body_size,
                "credit": args.credit,
                "rate": args.rate,
                "duration_s": args.duration,
            },
            figures=figures,
            series=series,
        )
    ]


SCENARIO: Final = Scenario(
    name="memory-budget",
    help="unthrottled publisher and a 500 msg/s consumer for 60 s under --memory-budget 64MiB",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
