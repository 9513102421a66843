"""``python -m bench adversary``: the randomized adversary of issue 31 for as long as asked.

Runs seed after seed (each on a fresh ``sluicegate serve --memory-budget``) until ``--minutes``
are spent, checking the invariants of docs/adversary.md after every step with the strict
prober limit (1 s). A breach is printed with its seed and step, shrunk, and written as a
reproduction file that ``--replay FILE`` runs again; ``--seed S --steps N`` replays the first
N steps of a seed. The adversary itself lives in ``tests/support/adversary/``, with the raw
frame client it drives, so that the CI test and this long run share one implementation.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Final, TextIO

from sluicegate.gateway.config import parse_size

__all__ = ["NAME", "add_parser", "main"]

NAME: Final = "adversary"
TESTS: Final = Path(__file__).resolve().parent.parent / "tests"
STEPS_PER_SEED: Final = 2000  # one server's life: long enough to build state, short enough to vary
SHRINK_MINUTES: Final = 10.0
DEFAULT_OUTPUT: Final = Path("bench/results/adversary")
EXIT_BREACH: Final = 1


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``adversary`` subcommand and its options."""
    parser = commands.add_parser(
        NAME,
        help="a randomized raw-frame adversary against a fresh sluicegate, invariants every step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=5.0, metavar="N")
    parser.add_argument("--seed", type=int, help="the first seed (default: a random one)")
    parser.add_argument("--steps", type=int, metavar="N", help="with --seed: replay N steps once")
    parser.add_argument("--replay", type=Path, metavar="FILE", help="a saved reproduction")
    parser.add_argument("--steps-per-seed", type=int, default=STEPS_PER_SEED, metavar="N")
    parser.add_argument("--budget", default="64MiB", metavar="SIZE", help="--memory-budget")
    parser.add_argument("--prober-limit", type=float, default=1.0, metavar="S")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="serve with --workers N; most link steps aim at another worker's queue",
    )
    parser.add_argument(
        "--handover",
        action="store_true",
        help="with --workers: hand each connection to its first link's queue's worker",
    )
    parser.add_argument("--only", action="append", default=[], metavar="ACTION")
    parser.add_argument("--without", action="append", default=[], metavar="ACTION")
    parser.add_argument("--shrink-minutes", type=float, default=SHRINK_MINUTES, metavar="N")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, metavar="DIR")


def _exit_on_signal(number: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + number)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run, replay or shrink as the options say; 1 if any invariant was breached."""
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the run's server and prober go too.
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        return _main(args, sys.stderr if out is None else out)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace, stream: TextIO) -> int:
    if str(TESTS) not in sys.path:  # the adversary is test support: tests/ is its import root
        sys.path.insert(0, str(TESTS))
    from support.adversary import steps as plan
    from support.adversary.run import Limits, Result, run, shrink

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    try:
        weights = plan.weights_from(args.only, args.without)
    except ValueError as error:
        say(f"python -m bench adversary: {error}")
        return 2
    limits = Limits(
        budget=parse_size("--budget", args.budget),
        prober_s=args.prober_limit,
        workers=args.workers,
        handover=args.handover,
    )
    args.output.mkdir(parents=True, exist_ok=True)

    def report(seed: int | None, steps: list[plan.Step], result: Result) -> None:
        breach = result.breach
        assert breach is not None
        say(f"BREACH seed={seed} {breach}")
        if 0 <= breach.step < len(steps):
            say(f"  step {breach.step}: {steps[breach.step].describe()}")
        shrunk, seen = shrink(steps, breach, limits, seconds=args.shrink_minutes * 60, log=say)
        name = f"breach-{seen.invariant}-seed{seed}-{int(time.time())}.json"
        path = args.output / name
        plan.save(
            path,
            shrunk,
            seed=seed,
            budget=limits.budget,
            workers=limits.workers,
            handover=limits.handover,
            breach=str(seen),
        )
        say(f"  reproduction ({len(shrunk)} steps, {seen}):")
        say(f"  python -m bench adversary --replay {path}")
        for step in shrunk:
            say(f"    {step.describe()}")

    def summary(seed: int | None, result: Result, seconds: float) -> None:
        say(
            f"seed={seed}: {result.steps} steps in {seconds:.0f} s, "
            f"RSS base {result.base_rss / 2**20:.0f} MiB peak {result.peak_rss / 2**20:.0f} MiB, "
            f"prober worst {result.worst_round_s * 1000:.0f} ms over {result.rounds} rounds, "
            f"{result.deliveries} deliveries, {result.dropped} connections dropped, "
            f"errors {result.conditions}: {result.breach or 'no breach'}"
            + (f"; adversary faults {result.faults}" if result.faults else "")
            + (f"; hand-overs {result.handovers}" if result.handovers else "")
        )

    if args.replay is not None or args.steps is not None:
        if args.replay is not None:
            steps, context = plan.load(args.replay)
            seed = context.get("seed")
            seed = seed if isinstance(seed, int) else None
            workers = context.get("workers")
            if isinstance(workers, int) and workers != limits.workers:
                limits = replace(limits, workers=workers)
            handover = context.get("handover")
            if isinstance(handover, bool):
                limits = replace(limits, handover=handover)
        else:
            if args.seed is None:
                say("python -m bench adversary: --steps needs --seed")
                return 2
            seed = args.seed
            steps = plan.generate(seed, args.steps, weights, limits.workers)
        started = time.monotonic()
        result = run(steps, limits, log=say)
        summary(seed, result, time.monotonic() - started)
        if result.breach is not None:
            report(seed, steps, result)
            return EXIT_BREACH
        return 0

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    say(
        f"adversary: first seed {seed}, {args.minutes:g} minutes, {limits.workers} worker(s)"
        f"{', hand-overs' if limits.handover else ''}, actions {sorted(weights)}"
    )
    end = time.monotonic() + args.minutes * 60
    breaches = 0
    while time.monotonic() < end:
        steps = plan.generate(seed, args.steps_per_seed, weights, limits.workers)
        started = time.monotonic()
        try:
            result = run(steps, limits, until=end, log=say)
            summary(seed, result, time.monotonic() - started)
            if result.breach is not None:
                breaches += 1
                report(seed, steps[: result.steps], result)
        except RuntimeError as error:
            # A server or prober that could not start (a machine loaded past READY_S) loses
            # this seed, not the hours of the run.
            say(f"seed={seed}: not run: {error}")
        seed += 1
    say(f"adversary: done, {breaches} breaches")
    return EXIT_BREACH if breaches else 0
