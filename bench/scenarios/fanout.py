"""Fan-out: one publisher to a fanout exchange bound to 10 queues, one consumer on all of them.

Each message becomes ten copies, which is where the per-connection account matters (issue 5: the
copies a publisher caused borrow from its connection's account until stored). The exchange,
queues and bindings are declared through RabbitMQ 4's ``/management`` API, so the same run works
against RabbitMQ 4; a server without that API or without exchanges fails with one line.
"""

from __future__ import annotations

import argparse
import time
from typing import Final, TextIO

from bench.clients import ClientError, ConsumerPlan, ConsumerProcess, SenderProcess
from bench.management import Management, ManagementError
from bench.probes import BUDGET_GAUGES
from bench.record import Record
from bench.runs import counter_probe, rate_series, server_figures, server_sampler, unique_queue
from bench.scenario import Scenario
from bench.series import extent
from bench.servers import MissingFeature, Server, Target, running
from bench.table import Cell

__all__ = ["SCENARIO", "run"]

QUEUES: Final[int] = 10  # issue 5's fan-out
DURATION_S: Final[float] = 30.0
BODY_SIZE: Final[int] = 100
CREDIT: Final[int] = 1000  # per queue: the consumer keeps up, so the publisher sets the pace
DRAIN_TIMEOUT_S: Final[float] = 120.0  # after publishing, for the consumer to take every copy
COLUMNS: Final[tuple[str, ...]] = (
    "sent",
    "accepted",
    "copies taken",
    "publish msg/s",
    "copies/s",
    "debt max",
    "RSS peak MB",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--queues, --duration, --body-size, --credit."""
    parser.add_argument("--queues", type=int, default=QUEUES, metavar="N")
    parser.add_argument("--duration", type=float, default=DURATION_S, metavar="S")
    parser.add_argument("--body-size", type=int, default=BODY_SIZE, metavar="B")
    parser.add_argument("--credit", type=int, default=CREDIT, metavar="C")


def declare(server: Server, exchange: str, queues: list[str]) -> None:
    """The exchange, its queues and bindings; ``MissingFeature`` if the server cannot."""
    try:
        with Management(server.host, server.port) as management:
            management.declare_exchange(exchange, "fanout")
            for queue in queues:
                management.declare_queue(queue)
                management.bind(exchange, queue)
    except ManagementError as error:
        raise MissingFeature(
            f"fan-out needs exchanges declared through /management (issues 6 and 10): {error}"
        ) from None


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Declare, publish for the duration while consuming every queue, then drain."""
    exchange = unique_queue("fanout")
    queues = [f"{exchange}-{i + 1}" for i in range(args.queues)]
    with running(target, metrics=True) as server:
        declare(server, exchange, queues)
        sampler = server_sampler(server, BUDGET_GAUGES)
        publisher = SenderProcess(
            server.host,
            server.port,
            f"/exchanges/{exchange}",
            body_size=args.body_size,
            duration=args.duration,
        )
        addresses = tuple(server.address(q) for q in queues)
        consumer = ConsumerProcess(
            ConsumerPlan(
                server.host,
                server.port,
                addresses,
                args.credit,
                None,
                args.duration + DRAIN_TIMEOUT_S,
            )
        )
        for name, read in (
            ("publisher sent", lambda: publisher.sent),
            ("copies taken", lambda: consumer.taken),
        ):
            probe, units = counter_probe(name, read)
            sampler.add(probe, units)
        print(
            f"{target.name}: publishing to a fanout exchange bound to {args.queues} queues "
            f"for {args.duration:g} s",
            file=out,
            flush=True,
        )
        sampler.start()
        consumer.start()
        publisher.start()
        try:
            done = publisher.wait(args.duration + DRAIN_TIMEOUT_S)
            expected = done.accepted * args.queues
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while consumer.taken < expected and not consumer.poll():
                if time.monotonic() > deadline:
                    raise ClientError(
                        f"consumer took {consumer.taken:,} of {expected:,} copies "
                        f"{DRAIN_TIMEOUT_S:g} s after publishing ended"
                    )
                consumer.channel.poll(0.1)
            finished = sampler.elapsed()
        finally:
            publisher.stop()
            consumer.stop()
        series = sampler.stop()
    debt = series.get("account debt")
    debt_extent = extent(debt.points) if debt else None
    figures: dict[str, Cell] = {
        "sent": done.sent,
        "accepted": done.accepted,
        "copies taken": consumer.taken,
        "publish msg/s": done.sent / args.duration,
        "copies/s": consumer.taken / finished if finished > 0 else None,
        "debt max": None if debt_extent is None else debt_extent.peak,
        "RSS peak MB": server_figures(series)["RSS peak MB"],
    }
    rate_series(series, "publisher sent", "publisher rate")
    rate_series(series, "copies taken", "copies rate")
    return [
        Record(
            server=target.name,
            case=f"{args.queues} queues",
            parameters={
                "queues": args.queues,
                "duration_s": args.duration,
                "body_size": args.body_size,
                "credit": args.credit,
            },
            figures=figures,
            series=series,
        )
    ]


SCENARIO: Final = Scenario(
    name="fanout",
    help="one publisher to a fanout exchange bound to 10 queues, all consumed: copies/s, debt",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
