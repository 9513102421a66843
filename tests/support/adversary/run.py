"""One adversary run against a fresh server, the invariants after every step, and shrinking.

The invariants (docs/adversary.md):

- ``rss``: the server's RSS stays within base + memory budget + 64 MiB;
- ``prober``: after every step a prober round ends within the limit (1 s for the bench),
  and ``prober-failed``: it does not fail;
- ``internal-error``: the server logs no internal error, and ``server-died``: it keeps running;
- ``lost``: every message the server accepted from the prober comes back to it;
- ``sigterm``: at the end SIGTERM makes the server exit within its shutdown grace.

A breach is shrunk by delta debugging: the steps up to the breach, then ever smaller subsets
that still breach the same invariant, each on a fresh server, until none can be removed or the
time for shrinking is spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from support.adversary.actions import Fleet
from support.adversary.starved import family, runqueue_wait, unexplained
from support.adversary.steps import Step
from support.adversary.watch import ProberProcess, Round, ServerProcess

__all__ = ["Breach", "Limits", "Result", "run", "shrink"]

MiB: Final = 1024 * 1024
WARM_ROUNDS: Final = 3  # prober rounds before the base RSS is read: proton's first use warms up
WARM_S: Final = 30.0  # for each of them: a first connection on a loaded machine, not a limit
# sluicegate's default --shutdown-timeout (5 s) plus the interpreter's exit, on a loaded machine.
GRACE_S: Final = 15.0
# A starved prober is waited for as long again as the machine withheld a CPU, up to this much
# more, in steps of at least this much: a held prober still breaches in limit + that at most.
STARVED_MAX_S: Final = 10.0
STARVED_STEP_S: Final = 0.05
DRAIN_S: Final = 5.0  # the final drain's wait for each message the prober has not seen yet


@dataclass(frozen=True)
class Limits:
    """The bounds a run holds the server to."""

    budget: int = 64 * MiB
    rss_margin: int = 64 * MiB  # the margin: interpreter, proton buffers, fragmentation
    prober_s: float = 1.0
    grace_s: float = GRACE_S
    server_options: tuple[str, ...] = ()
    # Worker processes (--workers N): the budget is split over them, RSS and CPU summed.
    workers: int = 1
    # With workers: hand a connection to its first link's queue's worker (`--worker-handover`).
    # Off by default, so that the link steps aimed at another worker's queue load the channel.
    handover: bool = False


@dataclass(frozen=True)
class Breach:
    """An invariant the server broke, seen after step ``step`` (-1: at the end of the run)."""

    invariant: str
    step: int
    detail: str

    def __str__(self) -> str:
        where = "at the end" if self.step < 0 else f"after step {self.step}"
        return f"{self.invariant} {where}: {self.detail}"


@dataclass
class Result:
    """What a run did and saw."""

    steps: int = 0
    breach: Breach | None = None
    base_rss: int = 0
    peak_rss: int = 0
    worst_round_s: float = 0.0
    rounds: int = 0
    dropped: int = 0
    deliveries: int = 0
    conditions: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)
    handovers: dict[str, int] = field(default_factory=dict)


def run(
    steps: Iterable[Step],
    limits: Limits,
    *,
    until: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Result:
    """Perform ``steps`` (until the monotonic time ``until``) and check after each one."""
    result = Result()
    # Its link steps aim at another worker's queue to load the channel: no hand-overs unless
    # asked for (docs/workers.md#handing-a-connection-over).
    workers = (
        ["--workers", str(limits.workers), "--worker-handover", str(limits.handover).lower()]
        if limits.workers > 1
        else []
    )
    server = ServerProcess(
        ["--memory-budget", str(limits.budget), *workers, *limits.server_options]
    )
    prober = ProberProcess(server.port, server.pid, lambda: family(server.pid))
    fleet = Fleet(
        "127.0.0.1",
        server.port,
        server.metrics_port,
        server.workers() if workers else [],
        server.http_api_port,
    )
    try:
        prober.start()
        for _ in range(WARM_ROUNDS):
            served = prober.served_after(time.monotonic(), WARM_S)
            if served is None or served.error is not None:
                raise RuntimeError(f"the prober is not served before any step: {served}")
        result.base_rss = result.peak_rss = server.rss()
        prober.take_latest()  # the warm rounds are no step's
        for index, step in enumerate(steps):
            if until is not None and time.monotonic() >= until:
                break
            fleet.perform(step)
            result.steps = index + 1
            result.actions[step.action] = result.actions.get(step.action, 0) + 1
            result.breach = _check(index, server, prober, limits, result)
            if result.breach is not None:
                if limits.handover:
                    result.handovers = server.handovers()
                if log is not None:
                    log(f"breach after step {index}: {step.describe()}")
                _after_breach(server, limits, log)
                return result
        fleet.close()
        if limits.handover:
            result.handovers = server.handovers()  # before the end's checks stop the server
        result.breach = _check(-1, server, prober, limits, result)
        if result.breach is not None:
            _after_breach(server, limits, log)
        else:
            result.breach = _finish(server, prober, limits)
        return result
    finally:
        result.dropped = fleet.dropped
        result.deliveries = fleet.deliveries
        result.conditions = dict(fleet.conditions)
        result.faults = dict(fleet.faults)
        result.rounds = prober.count
        fleet.close()
        prober.kill()
        server.kill()


def _check(
    index: int, server: ServerProcess, prober: ProberProcess, limits: Limits, result: Result
) -> Breach | None:
    moment = time.monotonic()
    cpu = server.cpu_seconds()
    if server.process.poll() is not None:
        return Breach("server-died", index, f"exit status {server.process.returncode}")
    errors = server.new_errors()
    if errors:
        return Breach("internal-error", index, " | ".join(errors))
    rss = server.rss()
    result.peak_rss = max(result.peak_rss, rss)
    bound = result.base_rss + limits.budget + limits.rss_margin
    if rss > bound:
        return Breach(
            "rss", index, f"RSS {rss / MiB:.0f} MiB > base + budget + margin {bound / MiB:.0f} MiB"
        )
    served, starved = _served(moment, server, prober, limits.prober_s)
    if served is None:
        # The server's CPU meanwhile tells a busy server (near the wait) from a held prober (0),
        # the run-queue waits a held prober from a starved one (support/adversary/starved.py).
        busy = server.cpu_seconds() - cpu
        return Breach(
            "prober",
            index,
            f"no prober round ended within {limits.prober_s:g} s (prober {prober.phase}, "
            f"server CPU {busy:.2f} s meanwhile, {starved}, RSS {rss / MiB:.0f} MiB; "
            f"{server.hold_gauges()}; budget: {server.budget_holders()})"
            f"{prober.stacks_since(moment)}",
        )
    result.worst_round_s = max(result.worst_round_s, served.seconds)
    if served.error is not None:
        # What each worker's budget held then tells a refusal's cause (a publish given back
        # by a blocked owner, gateway/peers.py) from a broken server.
        return Breach(
            "prober-failed",
            index,
            f"{served.error} (RSS {rss / MiB:.0f} MiB; {server.hold_gauges()}; "
            f"budget: {server.budget_holders()})",
        )
    slowest = prober.take_latest()
    if slowest is not None and slowest.unexplained > limits.prober_s and slowest.end <= moment:
        return Breach(
            "prober",
            index,
            f"a prober round during the step took {slowest.seconds:.2f} s (server CPU "
            f"{slowest.server_cpu:.2f} s during it, "
            f"{Starved(slowest.server_wait, slowest.prober_wait)})"
            f"{prober.stacks_since(slowest.start)}",
        )
    # The round's own measures: it may have begun during the step, before ``moment``.
    within = Starved(served.server_wait, served.prober_wait)
    if unexplained(served.seconds, within.server, within.prober) > limits.prober_s:
        return Breach(
            "prober",
            index,
            f"a prober round took {served.seconds:.2f} s (server CPU {served.server_cpu:.2f} s "
            f"during it, {within}){prober.stacks_since(served.start)}",
        )
    return None


@dataclass(frozen=True)
class Starved:
    """Seconds the server and the prober waited for a CPU while the prober was waited for."""

    server: float
    prober: float

    def __str__(self) -> str:
        return f"run-queue wait: server {self.server:.2f} s, prober {self.prober:.2f} s"


def _served(
    moment: float, server: ServerProcess, prober: ProberProcess, limit: float
) -> tuple[Round | None, Starved]:
    """The first prober round that ended after ``moment``, waited for ``limit`` seconds plus
    what the machine withheld from the server and the prober meanwhile (at most
    :data:`STARVED_MAX_S` more), and those run-queue waits."""
    server_before = runqueue_wait(server.pid)
    prober_before = runqueue_wait(prober.pid)
    deadline = moment + limit
    while True:
        served = prober.served_after(moment, deadline - moment)
        starved = Starved(
            runqueue_wait(server.pid) - server_before, runqueue_wait(prober.pid) - prober_before
        )
        if served is not None:
            return served, starved
        extended = moment + limit + min(max(starved.server, starved.prober), STARVED_MAX_S)
        if extended <= deadline + STARVED_STEP_S:
            return None, starved
        deadline = extended


def _after_breach(server: ServerProcess, limits: Limits, log: Callable[[str], None] | None) -> None:
    """Whether the breached server still answers SIGTERM: part of what the breach did."""
    if log is None or server.process.poll() is not None:
        return
    took = server.terminate(limits.grace_s)
    answer = "no exit" if took is None else f"exit in {took:.1f} s"
    log(f"after the breach, SIGTERM: {answer} (grace {limits.grace_s:g} s)")


def _finish(server: ServerProcess, prober: ProberProcess, limits: Limits) -> Breach | None:
    try:
        lost = prober.finish(DRAIN_S)
    except RuntimeError as error:
        return Breach("prober-failed", -1, str(error))
    if lost:
        return Breach("lost", -1, f"{len(lost)} accepted messages never came back: {lost[:5]}")
    took = server.terminate(limits.grace_s)
    if took is None:
        return Breach("sigterm", -1, f"the server still ran {limits.grace_s:g} s after SIGTERM")
    return None


def shrink(
    steps: Sequence[Step],
    breach: Breach,
    limits: Limits,
    *,
    seconds: float,
    log: Callable[[str], None] | None = None,
) -> tuple[list[Step], Breach]:
    """A smaller list of steps that breaches ``breach.invariant`` too (delta debugging).

    Returns the steps up to the breach unchanged if even they do not breach again (a breach
    that depends on timing), with the breach as first seen.
    """
    deadline = time.monotonic() + seconds
    current = list(steps if breach.step < 0 else steps[: breach.step + 1])
    found = breach

    def breaches(candidate: list[Step]) -> Breach | None:
        try:
            seen = run(candidate, limits).breach
        except RuntimeError as error:  # a server that could not start: this try tells nothing
            if log is not None:
                log(f"shrinking: {len(candidate)} steps -> not run: {error}")
            return None
        if log is not None:
            log(f"shrinking: {len(candidate)} steps -> {seen or 'no breach'}")
        return seen if seen is not None and seen.invariant == breach.invariant else None

    again = breaches(current)
    if again is None:
        return current, found
    found = again
    parts = 2
    while len(current) > 1 and time.monotonic() < deadline:
        size = -(-len(current) // parts)
        for start in range(0, len(current), size):
            candidate = current[:start] + current[start + size :]
            seen = breaches(candidate) if candidate else None
            if seen is not None:
                current = candidate if seen.step < 0 else candidate[: seen.step + 1]
                found = seen
                parts = max(parts - 1, 2)
                break
            if time.monotonic() >= deadline:
                break
        else:
            if parts >= len(current):
                break
            parts = min(len(current), parts * 2)
    return current, found
