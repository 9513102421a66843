"""``python -m bench SCENARIO``: run a scenario against sluicegate, a URL, or several side by side.

Progress goes to stderr; the Markdown table alone goes to stdout, so it can be pasted into
``docs/benchmarks.md``. Each invocation writes ``SCENARIO.json`` and ``SCENARIO.png`` under
``--output``. A server that lacks what the scenario measures fails with one line naming the
missing feature and a non-zero exit; other servers of a ``--compare`` still run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench import adversary
from bench.clients import ClientError
from bench.plot import plot_report
from bench.record import Report
from bench.runs import ScenarioError
from bench.scenario import Scenario
from bench.scenarios import (
    connections,
    durable,
    fanout,
    hostile,
    memory_budget,
    slow_consumer,
    tenant,
    throughput,
    workers,
)
from bench.servers import START, ServerError, Target, parse_target

__all__ = ["SCENARIOS", "main", "targets_from"]

PROG: Final[str] = "python -m bench"
SCENARIOS: Final[dict[str, Scenario]] = {
    s.name: s
    for s in (
        throughput.SCENARIO,
        slow_consumer.SCENARIO,
        memory_budget.SCENARIO,
        fanout.SCENARIO,
        durable.SCENARIO,
        connections.SCENARIO,
        tenant.SCENARIO,
        hostile.SCENARIO,
        workers.SCENARIO,
    )
}
DEFAULT_OUTPUT: Final[Path] = Path("bench/results")
EXIT_FAILED: Final[int] = 1
EXIT_USAGE: Final[int] = 2
EPILOG: Final[str] = f"""\
Servers: without --url or --compare, each run starts its own sluicegate
(python -m sluicegate serve --listen 127.0.0.1:0). --url amqp://HOST:PORT[/PREFIX] uses any AMQP 1.0
server; PREFIX is put before queue names (default /queues/; RabbitMQ 3.x wants /queue/).
--compare NAME=URL ... runs the scenario against each (URL {START!r}: a fresh sluicegate), and
--pid PID (or NAME=PID) lets the bench sample the RSS and CPU of a server it did not start.
"""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per scenario."""
    parser = argparse.ArgumentParser(prog=PROG, description="sluicegate's benchmark scenarios.")
    commands = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for scenario in SCENARIOS.values():
        sub = commands.add_parser(
            scenario.name,
            help=scenario.help,
            description=scenario.help,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        scenario.add_arguments(sub)
        servers = sub.add_mutually_exclusive_group()
        servers.add_argument("--url", metavar="URL", help="an AMQP 1.0 server to measure")
        servers.add_argument(
            "--compare", nargs="+", metavar="NAME=URL", help="several servers, side by side"
        )
        sub.add_argument(
            "--pid", action="append", default=[], metavar="[NAME=]PID", help="server process ids"
        )
        sub.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, metavar="DIR")
    adversary.add_parser(commands)
    return parser


def targets_from(
    url: str | None, compare: Sequence[str] | None, pids: Sequence[str]
) -> list[Target]:
    """The servers to run against; ``ValueError`` with a one-line reason."""
    by_name: dict[str, int] = {}
    single: int | None = None
    for text in pids:
        name, equals, number = text.rpartition("=")
        if not number.isdigit():
            raise ValueError(f"--pid expects PID or NAME=PID, got {text!r}")
        if equals:
            by_name[name] = int(number)
        else:
            single = int(number)
    if compare:
        pairs = [entry.partition("=") for entry in compare]
        if any(not equals for _, equals, _ in pairs):
            raise ValueError("--compare expects NAME=URL entries")
        names = [name for name, _, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError("--compare names must differ")
        unknown = set(by_name) - set(names)
        if unknown or single is not None:
            raise ValueError("with --compare, give --pid as NAME=PID for a named server")
        return [parse_target(name, u, by_name.get(name)) for name, _, u in pairs]
    if by_name:
        raise ValueError("NAME=PID is for --compare; give --pid PID with --url")
    if url is None:
        if single is not None:
            raise ValueError(
                "--pid is for a server given by --url (a started one is sampled anyway)"
            )
        return [Target("sluicegate", START)]
    return [parse_target("server", url, single)]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run the scenario against each target, print the table; return the exit status."""
    args = build_parser().parse_args(argv)
    if args.scenario == adversary.NAME:
        try:
            return adversary.main(args)
        except KeyboardInterrupt:
            print(f"{PROG} {adversary.NAME}: interrupted", file=sys.stderr)
            return 130
    scenario = SCENARIOS[args.scenario]
    try:
        targets = targets_from(args.url, args.compare, args.pid)
    except ValueError as error:
        print(f"{PROG} {scenario.name}: {error}", file=sys.stderr)
        return EXIT_USAGE
    report = Report(scenario.name, scenario.columns)
    failed = False
    for target in targets:
        try:
            report.records += scenario.run(target, args, sys.stderr)
        except (ServerError, ScenarioError, ClientError) as error:
            print(f"{PROG} {scenario.name}: {target.name}: {error}", file=sys.stderr)
            failed = True
        except KeyboardInterrupt:
            print(f"{PROG} {scenario.name}: interrupted", file=sys.stderr)
            return 130
    if report.records:
        args.output.mkdir(parents=True, exist_ok=True)
        report.write_json(args.output / f"{scenario.name}.json")
        try:
            plotted = plot_report(report, args.output / f"{scenario.name}.png")
        except ImportError:
            print(f"{PROG}: no plot without matplotlib: pip install -e '.[bench]'", file=sys.stderr)
            plotted = False
        written = f"{scenario.name}.json" + (" and .png" if plotted else "")
        print(f"wrote {written} under {args.output}", file=sys.stderr)
        print(report.table())
    return EXIT_FAILED if failed else 0
