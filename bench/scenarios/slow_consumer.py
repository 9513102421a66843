"""Slow consumer (issue 4): a full queue, a huge credit grant, an application reading slowly.

100,000 messages of 1 KB are queued first; then one consumer grants 100,000 credit and takes 500
messages per second for 30 s. Without the writer ← session ← queue loops a server would move the
whole queue into its session (RSS up by the queue's size again, outgoing_pending up to 100,000);
with them, RSS grows by less than 16 MB beyond the stored messages and outgoing_pending stays at
most 256 + a few. outgoing_pending comes from the server's Prometheus endpoint.
"""

from __future__ import annotations

import argparse
from typing import Final, TextIO

from bench.clients import ConsumerPlan, ConsumerProcess, SenderProcess
from bench.probes import BYTES_PER_MB, PENDING_GAUGES
from bench.record import Record
from bench.runs import counter_probe, rate_series, server_sampler, unique_queue
from bench.scenario import Scenario
from bench.series import Series, extent
from bench.servers import Target, running
from bench.table import Cell

__all__ = ["SCENARIO", "consumer_figures", "run"]

MESSAGES: Final[int] = 100_000  # issue 4's figures
BODY_SIZE: Final[int] = 1024
CREDIT: Final[int] = 100_000
RATE: Final[float] = 500.0
DURATION_S: Final[float] = 30.0
FILL_TIMEOUT_S: Final[float] = 600.0  # 100,000 messages through a slow server on a loaded machine
COLUMNS: Final[tuple[str, ...]] = (
    "stored MB",
    "RSS empty MB",
    "RSS filled MB",
    "RSS peak MB",
    "RSS end MB",
    "growth MB",
    "pending max",
    "taken",
    "consumer msg/s",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Issue 4's figures, adjustable for a quick look."""
    parser.add_argument("--messages", type=int, default=MESSAGES, metavar="N")
    parser.add_argument("--body-size", type=int, default=BODY_SIZE, metavar="B")
    parser.add_argument("--credit", type=int, default=CREDIT, metavar="C")
    parser.add_argument("--rate", type=float, default=RATE, metavar="MSG/S")
    parser.add_argument("--duration", type=float, default=DURATION_S, metavar="S")


def consumer_figures(
    series: dict[str, Series], filled_at: float, stored_mb: float, taken: int, duration: float
) -> dict[str, Cell]:
    """The table row: RSS before and after filling, peak and end while consuming, pending max."""
    rss = series.get("server RSS")
    before = [p for p in rss.points if p[0] < filled_at] if rss else []
    during = [p for p in rss.points if p[0] >= filled_at] if rss else []
    empty, consuming = extent(before), extent(during)
    pending = series.get("outgoing_pending max")
    pending_extent = extent(pending.points) if pending else None
    return {
        "stored MB": stored_mb,
        "RSS empty MB": None if empty is None else empty.start,
        "RSS filled MB": None if consuming is None else consuming.start,
        "RSS peak MB": None if consuming is None else consuming.peak,
        "RSS end MB": None if consuming is None else consuming.end,
        "growth MB": None if consuming is None else consuming.peak - consuming.start,
        "pending max": None if pending_extent is None else pending_extent.peak,
        "taken": taken,
        "consumer msg/s": taken / duration if duration > 0 else None,
    }


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Fill, then consume slowly while sampling RSS and outgoing_pending."""
    queue = unique_queue("slow")
    with running(target, metrics=True) as server:
        sampler = server_sampler(server, PENDING_GAUGES)
        address = server.address(queue)
        print(f"{target.name}: queueing {args.messages:,} messages of {args.body_size} B", file=out)
        sampler.start()
        filler = SenderProcess(
            server.host, server.port, address, body_size=args.body_size, count=args.messages
        ).start()
        try:
            filler.wait(FILL_TIMEOUT_S)
        finally:
            filler.stop()
        filled_at = sampler.elapsed()
        consumer = ConsumerProcess(
            ConsumerPlan(
                server.host, server.port, (address,), args.credit, args.rate, args.duration
            )
        )
        probe, units = counter_probe("consumer taken", lambda: consumer.taken)
        sampler.add(probe, units)
        print(
            f"{target.name}: consumer grants {args.credit:,} and takes {args.rate:g} msg/s "
            f"for {args.duration:g} s",
            file=out,
            flush=True,
        )
        consumer.start()
        try:
            while not consumer.poll():
                consumer.channel.poll(0.2)
        finally:
            consumer.stop()
        series = sampler.stop()
    rate_series(series, "consumer taken", "consumer rate")
    stored_mb = args.messages * args.body_size / BYTES_PER_MB
    figures = consumer_figures(series, filled_at, stored_mb, consumer.taken, args.duration)
    return [
        Record(
            server=target.name,
            case=f"credit {args.credit:,}, {args.rate:g} msg/s",
            parameters={
                "messages": args.messages,
                "body_size": args.body_size,
                "credit": args.credit,
                "rate": args.rate,
                "duration_s": args.duration,
                "filled_at_s": filled_at,
                "metrics": server.metrics_url,
            },
            figures=figures,
            series=series,
        )
    ]


SCENARIO: Final = Scenario(
    name="slow-consumer",
    help="100,000 messages of 1 KB queued, credit 100,000, 500 msg/s: RSS and outgoing_pending",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
