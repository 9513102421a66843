"""Hostile clients against the memory budget (issue 16): five attacks, RSS against the budget.

Each attack gets a fresh server started with ``--memory-budget`` (64 MiB by default, or twice
what the attack puts in its queues beforehand if that is more, as the issue measured with the
default budget) and a prober that keeps doing round trips on its own queue while it runs:

- ``reconnect``: 1,000 connections that each open, publish one message and close;
- ``partial``: 150 publisher links on one connection, each streaming a 7 MiB delivery in 64 KiB
  frames and never finishing it;
- ``credit``: 1,000 publisher links attached first, then all their credit spent at once with
  12 KiB messages;
- ``big-frames``: max-frame-size 2^32-1, eight browsers of a queue of 50 of 4 MiB messages, and a
  socket never read;
- ``unsettled``: a consumer granting 100,000 credit to a queue of 10,000 of 4 KiB messages and
  settling nothing.

The table gives the server's RSS before the attack (after any prefill), its peak while the
attack ran, and after the attacker left; the plot draws RSS against the line base + budget.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from multiprocessing.connection import Connection as Channel
from typing import Final, TextIO

from bench.attacks import ATTACKS, DONE, GO, LEAVE, LEFT, READY, AttackPlan, probe, run_attack
from bench.clients import ClientError
from bench.probes import BUDGET_GAUGES, BYTES_PER_MB
from bench.record import Record
from bench.runs import server_sampler, unique_queue
from bench.scenario import Scenario
from bench.series import Series, extent
from bench.servers import Target, running
from bench.table import Cell
from sluicegate.clients.children import end
from sluicegate.gateway.config import parse_size

__all__ = ["SCENARIO", "run"]

CONTEXT: Final = multiprocessing.get_context("spawn")
BUDGET: Final = "64MiB"
ATTACK_S: Final = 45.0  # how long an attack that does not end by itself goes on
SETTLE_S: Final = 3.0  # before "base" and after the attacker left, for steady readings
# A prefill of 200 MB, 1,000 connections or 1,000 attaches on a loaded machine.
LONG_PHASE_TIMEOUT_S: Final = 900.0
# Leaving is dropping a socket; an attacker silent this long is stuck.
LEAVE_TIMEOUT_S: Final = 60.0
END_GRACE_S: Final = 10.0  # for the attacker and the prober to end on SIGTERM
COLUMNS: Final = (
    "RSS base MB",
    "RSS peak MB",
    "RSS after MB",
    "peak - base MB",
    "after - base KB/conn",
    "prober trips",
    "prober max ms",
    "prober stalls",
    "budget MiB",
    "attacker",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--attack (repeatable; all five by default), --memory-budget, --duration."""
    parser.add_argument("--attack", action="append", choices=ATTACKS, metavar="NAME")
    parser.add_argument("--memory-budget", default=BUDGET, metavar="SIZE")
    parser.add_argument("--duration", type=float, default=ATTACK_S, metavar="S")


def _reply(channel: Channel, what: str, timeout: float) -> object:
    if not channel.poll(timeout):
        raise ClientError(f"attacker: no answer while {what} after {timeout:g} s")
    reply: object = channel.recv()
    if isinstance(reply, str) and reply not in (READY, DONE, "attacking"):
        raise ClientError(reply)
    return reply


def _at(series: Series | None, t: float) -> float | None:
    """The last sample at or before ``t``."""
    if series is None:
        return None
    before = [v for when, v in series.points if when <= t]
    return before[-1] if before else None


def _budget(attack: str, requested: str) -> int:
    """The budget for an attack: as requested, or twice its prefill if that is more."""
    plan = AttackPlan(attack, "", 0, "")
    prefill = {
        "big-frames": plan.big_messages * plan.big_body,
        "unsettled": plan.unsettled_messages * plan.unsettled_body,
    }.get(attack, 0)
    return max(parse_size("--memory-budget", requested), 2 * prefill)


def _one(target: Target, attack: str, args: argparse.Namespace, out: TextIO) -> Record:
    budget = _budget(attack, args.memory_budget)
    with running(target, ["--memory-budget", str(budget)], metrics=True) as server:
        sampler = server_sampler(server, BUDGET_GAUGES)
        plan = AttackPlan(attack, server.host, server.port, server.address_prefix)
        ours, theirs = CONTEXT.Pipe()
        attacker = CONTEXT.Process(target=run_attack, args=(plan, theirs), daemon=True)
        counts = CONTEXT.RawArray("d", 3)
        prober = CONTEXT.Process(
            target=probe,
            args=(server.host, server.port, server.address(unique_queue("probe")), counts),
            daemon=True,
        )
        print(f"{target.name}: {attack}: preparing", file=out, flush=True)
        sampler.start()
        attacker.start()
        try:
            _reply(ours, "preparing", LONG_PHASE_TIMEOUT_S)
            prober.start()
            time.sleep(SETTLE_S)
            base_at = sampler.elapsed()
            trips_before = counts[0]
            print(f"{target.name}: {attack}: attacking", file=out, flush=True)
            ours.send(GO)
            if _reply(ours, "attacking", LONG_PHASE_TIMEOUT_S) != DONE:
                time.sleep(args.duration)
            attack_end = sampler.elapsed()
            ours.send(LEAVE)
            left = _reply(ours, "leaving", LEAVE_TIMEOUT_S)
            assert isinstance(left, tuple)
            assert left[0] == LEFT
            time.sleep(SETTLE_S)
            after_at = sampler.elapsed()
            trips = counts[0] - trips_before
            longest, stalls = counts[1], counts[2]
        finally:
            for process in (attacker, prober):
                end(process, END_GRACE_S)
        series = sampler.stop()
    rss = series.get("server RSS")
    base = _at(rss, base_at)
    after = _at(rss, after_at)
    during = [p for p in rss.points if base_at <= p[0] <= attack_end] if rss else []
    span = extent(during)
    peak = None if span is None else span.peak
    if base is not None and rss is not None:
        line = base + budget / BYTES_PER_MB
        series["base + budget"] = Series(
            "base + budget", "MB", [(rss.points[0][0], line), (rss.points[-1][0], line)]
        )
    figures: dict[str, Cell] = {
        "RSS base MB": base,
        "RSS peak MB": peak,
        "RSS after MB": after,
        "peak - base MB": None if peak is None or base is None else peak - base,
        "after - base KB/conn": None
        if attack != "reconnect" or after is None or base is None
        else (after - base) * 1024 / plan.connections,
        "prober trips": int(trips),
        "prober max ms": longest * 1000,
        "prober stalls": int(stalls),
        "budget MiB": budget // (1024 * 1024),
        "attacker": str(left[1]),
    }
    print(f"{target.name}: {attack}: {figures}", file=out, flush=True)
    return Record(
        server=target.name,
        case=attack,
        parameters={"memory_budget": budget, "duration_s": args.duration},
        figures=figures,
        series=series,
    )


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Each chosen attack against a fresh server."""
    return [_one(target, attack, args, out) for attack in args.attack or ATTACKS]


SCENARIO: Final = Scenario(
    name="hostile",
    help="five attacks of issue 16 against --memory-budget 64MiB, with a prober served meanwhile",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
