"""Throughput: one quiver sender and receiver for a fixed time at each credit window.

Issue 4 asks that a large credit (100,000) is not slower than a small one (1,000);
docs/benchmarks.md has the reference figures. A started server is fresh for each credit, so RSS
is not carried over.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Final, TextIO

from bench.record import Record
from bench.runs import quiver_figures, run_quiver, server_figures, server_sampler, unique_queue
from bench.scenario import Scenario
from bench.servers import Server, Target, running

__all__ = ["SCENARIO", "run"]

DEFAULT_CREDITS: Final[tuple[int, ...]] = (100_000, 1_000)  # issue 4's pair
DEFAULT_DURATION_S: Final[float] = 30.0  # the reference runs' (docs/benchmarks.md)
BODY_SIZE: Final[int] = 100  # quiver's default and the reference runs'
COLUMNS: Final[tuple[str, ...]] = (
    "e2e msg/s",
    "sender msg/s",
    "receiver msg/s",
    "p50 ms",
    "p99 ms",
    "RSS peak MB",
    "server CPU %",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--credit (repeatable), --duration, --body-size, --durable."""
    parser.add_argument(
        "--credit", type=int, action="append", metavar="C", help="credit window (repeatable)"
    )
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, metavar="S")
    parser.add_argument("--body-size", type=int, default=BODY_SIZE, metavar="B")


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """One quiver run per credit window."""
    return [
        measure(target, credit, args.duration, args.body_size, out, "throughput")
        for credit in args.credit or DEFAULT_CREDITS
    ]


def measure(
    target: Target,
    credit: int,
    duration: float,
    body_size: int,
    out: TextIO,
    scenario: str,
    durable: bool = False,
    check: Callable[[Server], None] | None = None,
) -> Record:
    """One quiver run against a fresh (or the given) server, sampled; also used by ``durable``.

    ``check`` looks at the server after the run, before it is stopped.
    """
    options = [
        "--duration",
        f"{duration:g}",
        "--credit",
        str(credit),
        "--body-size",
        str(body_size),
    ]
    if durable:
        options.append("--durable")
    with running(target) as server:
        sampler = server_sampler(server)
        sampler.start()
        label = f"{target.name} credit {credit:,}"
        print(f"{label}: quiver {' '.join(options)}", file=out, flush=True)
        result = run_quiver(server.url(unique_queue(scenario)), options, sampler, out, label)
        series = sampler.stop()
        if check is not None:
            check(server)
    series.update(result.series)
    figures = quiver_figures(result.summary) | server_figures(series)
    return Record(
        server=target.name,
        case=f"credit {credit:,}",
        parameters={"credit": credit, "duration_s": duration, "body_size": body_size,
                    "durable": durable, "quiver": result.summary},
        figures=figures,
        series=series,
    )  # fmt: skip


SCENARIO: Final = Scenario(
    name="throughput",
    help="quiver sender → server → receiver at credit 100,000 and 1,000",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
