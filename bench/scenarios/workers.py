"""Workers: aggregate messages/s of 1, 2 and 4 queues with ``--workers 1`` and ``--workers 2``.

Issue 35's measure, all in one run so the ratios share the machine's load: for each number of
workers and of queues, one quiver sender and receiver per queue run at once for a fixed time
against a fresh server. With several workers, queue ``i`` is named so that it lives on worker
``i mod N`` (queues/queue_homes.py), and the kernel spreads the clients' connections over the
workers, so some of each queue's traffic crosses between them. The server's CPU is every one of
its processes' (the supervisor and its workers, from /proc), per message received; the share
spent crossing is what a message costs beyond the same queues on one worker, of what it costs.
The load average is printed with each case: the clients share the cores with the server, which
is why the quivers use the C arrows (``--impl c``, clients/quiver/native.py) whenever they can be
built: they take a fraction of the Python arrows' CPU (their own, per message, is a column).
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from functools import partial
from pathlib import Path
from typing import Final, TextIO

from bench.probes import Sampler
from bench.record import Record
from bench.runs import QuiverRun, ScenarioError, quiver_figures, run_quiver
from bench.scenario import Scenario
from bench.series import Series
from bench.servers import Target, running
from sluicegate.clients.quiver import native, procstat
from sluicegate.clients.quiver.native import NativeBuildError
from sluicegate.queues.queue_homes import proposed_home

__all__ = ["SCENARIO", "run"]

DEFAULT_WORKERS: Final[tuple[int, ...]] = (1, 2)  # the pair
DEFAULT_QUEUES: Final[tuple[int, ...]] = (1, 2, 4)
DEFAULT_DURATION_S: Final[float] = 20.0  # long enough for the batches to settle, 12 cases fit
CREDIT: Final[int] = 1_000  # quiver's default credit window
BODY_SIZE: Final[int] = 100  # quiver's default and the issue's figures'
COLUMNS: Final[tuple[str, ...]] = (
    "aggregate msg/s",
    "server CPU µs/msg",
    "client CPU µs/msg",
    "vs 1 worker CPU/msg",
    "crossing share %",
    "clients on owner",
    "load avg",
)
# Seconds between looks at where the quivers' connections landed, until each quiver's sender
# and receiver are both found (on a loaded machine the quivers of one case start seconds
# apart).
PLACEMENT_EVERY_S: Final = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--workers and --queues (repeatable), --duration, --body-size, --impl."""
    parser.add_argument("--workers", type=int, action="append", metavar="N", help="repeatable")
    parser.add_argument("--queues", type=int, action="append", metavar="Q", help="repeatable")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, metavar="S")
    parser.add_argument("--body-size", type=int, default=BODY_SIZE, metavar="B")
    parser.add_argument(
        "--no-handover",
        action="store_true",
        help="serve with --worker-handover false: clients stay where the kernel put them",
    )
    parser.add_argument(
        "--impl",
        choices=("c", "python"),
        help="the quivers' arrows (default: c when it builds here, else python)",
    )


def choose_impl(wanted: str | None, out: TextIO) -> str:
    """The arrows to use: as asked, or C when it builds (built once here, not per quiver)."""
    if wanted == "python":
        return wanted
    try:
        native.build()
    except NativeBuildError as error:
        if wanted == "c":
            raise ScenarioError(str(error)) from None
        print(f"the quivers use Python arrows: {error}", file=out, flush=True)
        return "python"
    return "c"


def run(target: Target, args: argparse.Namespace, out: TextIO) -> list[Record]:
    """Every (workers, queues) case; ratios against one worker with as many queues."""
    if not target.started:
        raise ScenarioError("the workers scenario starts its own servers (no --url)")
    records: list[Record] = []
    single: dict[int, float] = {}
    impl = choose_impl(args.impl, out)
    for workers in args.workers or DEFAULT_WORKERS:
        for queues in args.queues or DEFAULT_QUEUES:
            record = measure(
                target,
                workers,
                queues,
                args.duration,
                args.body_size,
                impl,
                out,
                handover=not args.no_handover,
            )
            cost = record.figures["server CPU µs/msg"]
            assert isinstance(cost, float)
            if workers == 1:
                single[queues] = cost
            elif queues in single:
                record.figures["vs 1 worker CPU/msg"] = cost / single[queues]
                record.figures["crossing share %"] = max(0.0, 100 * (1 - single[queues] / cost))
            records.append(record)
    return records


def queue_names(workers: int, queues: int) -> list[str]:
    """Queue ``i`` on worker ``i mod workers``: with as many queues as workers, one each."""
    names: list[str] = []
    candidates = (f"workers-q{n}" for n in range(100_000))
    for index in range(queues):
        wanted = index % workers
        names.append(
            next(name for name in candidates if proposed_home("/", name, workers) == wanted)
        )
    return names


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text()
        except OSError:
            continue
        pending.extend(int(child) for child in children.split())
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def clients_on_owner(
    server_pid: int, server_port: int, quivers: dict[str, int], workers: int
) -> tuple[int, int]:
    """Of the quivers' connections to the server, how many the worker owning their queue
    accepted, and how many there are. The kernel spreads connections over the workers
    (``SO_REUSEPORT``) whatever their address, so this says how many of a case's messages
    cross: a sender off its queue's worker crosses to publish, a receiver to consume.
    ``quivers`` maps each queue to its quiver's pid (its arrows are its descendants)."""
    worker_pids = [
        int(child)
        for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    ]
    # Worker K holds its data directory, worker-K/, open (its log).
    index_of: dict[int, int] = {}
    for pid in worker_pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            match = re.search(r"/worker-(\d+)/", link)
            if match is not None:
                index_of[pid] = int(match.group(1))
                break
    held_by = {inode: index_of[pid] for pid in index_of for inode in _socket_inodes(pid)}
    served: dict[int, int] = {}  # client port -> worker index
    client_inodes: dict[str, int] = {}  # a client socket's inode -> its local port
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local = int(fields[1].rsplit(":", 1)[1], 16)
        remote = int(fields[2].rsplit(":", 1)[1], 16)
        if local == server_port and fields[9] in held_by:
            served[remote] = held_by[fields[9]]
        elif remote == server_port:
            client_inodes[fields[9]] = local
    on_owner = total = 0
    for name, quiver in quivers.items():
        home = proposed_home("/", name, workers)
        for pid in _descendants(quiver):
            for inode in _socket_inodes(pid) & client_inodes.keys():
                worker = served.get(client_inodes[inode])
                if worker is not None:
                    total += 1
                    on_owner += worker == home
    return on_owner, total  # fmt: skip


def tree_ticks(pid: int) -> int:
    """CPU clock ticks of ``pid`` and of all its children (a supervisor's workers)."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            total += procstat.parse_stat_ticks(Path(f"/proc/{current}/stat").read_text())
            children = Path(f"/proc/{current}/task/{current}/children").read_text()
        except OSError:
            continue
        pending.extend(int(child) for child in children.split())
    return total


def measure(
    target: Target,
    workers: int,
    queues: int,
    duration: float,
    body_size: int,
    impl: str,
    out: TextIO,
    *,
    handover: bool = True,
) -> Record:
    """One case: ``queues`` quiver pairs at once against a fresh server of ``workers``;
    ``handover``: connections go to their queue's worker at their first ATTACH
    (docs/workers.md#handing-a-connection-over)."""
    options = [
        "--impl",
        impl,
        "--duration",
        f"{duration:g}",
        "--credit",
        str(CREDIT),
        "--body-size",
        str(body_size),
    ]
    served = ["--workers", str(workers)]
    if workers > 1 and not handover:
        served += ["--worker-handover", "false"]
    with running(target, served) as server:
        assert server.pid is not None
        sampler = Sampler()
        sampler.start()
        results: dict[str, QuiverRun | BaseException] = {}
        names = queue_names(workers, queues)
        label = f"{workers} worker{'s' * (workers > 1)}, {queues} queue{'s' * (queues > 1)}"
        print(f"{label}: quiver {' '.join(options)} on each queue", file=out, flush=True)

        quivers: dict[str, int] = {}
        placed: list[tuple[int, int]] = []

        def one(name: str) -> None:
            try:
                results[name] = run_quiver(
                    server.url(name),
                    options,
                    sampler,
                    out,
                    name,
                    partial(quivers.__setitem__, name),
                )
            except BaseException as error:
                results[name] = error

        def look() -> None:
            assert server.pid is not None
            while workers > 1 and any(thread.is_alive() for thread in threads[:-1]):
                time.sleep(PLACEMENT_EVERY_S)
                found = clients_on_owner(server.pid, server.port, dict(quivers), workers)
                if found[1] == 2 * len(names):
                    placed.append(found)
                    return

        before = tree_ticks(server.pid)
        started = time.monotonic()
        threads = [threading.Thread(target=one, args=(name,)) for name in names]
        threads.append(threading.Thread(target=look))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.monotonic() - started
        ticks = tree_ticks(server.pid) - before
        sampler.stop()
    failed = [result for result in results.values() if isinstance(result, BaseException)]
    if failed:
        raise ScenarioError(f"{label}: {failed[0]}")
    runs = {name: result for name, result in results.items() if isinstance(result, QuiverRun)}
    figures = [quiver_figures(result.summary) for result in runs.values()]
    messages = sum(int(f["messages"] or 0) for f in figures)
    rate = sum(float(f["e2e msg/s"] or 0) for f in figures)
    client_cpu = sum(client_cpu_s(result.summary) for result in runs.values())
    cpu = ticks / procstat.TICKS_PER_S
    load = os.getloadavg()[0]
    on_owner = f"{placed[0][0]} of {placed[0][1]}" if placed else None
    if on_owner is not None:
        print(f"{label}: {on_owner} client connections on their queue's worker", file=out)
    print(f"{label}: {rate:,.0f} msg/s, {cpu:.1f} s server CPU and {client_cpu:.1f} s client "
          f"CPU in {seconds:.1f} s, load {load:.2f}", file=out, flush=True)  # fmt: skip
    series: dict[str, Series] = {}
    for name, result in runs.items():
        for key, found in result.series.items():
            series[f"{name} {key}"] = Series(f"{name} {key}", found.unit, found.points)
    return Record(
        server=target.name,
        case=label,
        parameters={"workers": workers, "queues": queues, "duration_s": duration,
                    "body_size": body_size, "credit": CREDIT, "server_cpu_s": cpu,
                    "messages": messages, "impl": impl, "client_cpu_s": client_cpu},
        figures={"aggregate msg/s": rate,
                 "server CPU µs/msg": cpu / messages * 1e6 if messages else float("nan"),
                 "client CPU µs/msg": client_cpu / messages * 1e6 if messages else float("nan"),
                 "vs 1 worker CPU/msg": None, "crossing share %": None,
                 "clients on owner": on_owner, "load avg": load},
        series=series,
    )  # fmt: skip


def client_cpu_s(summary: dict[str, object]) -> float:
    """The senders' and receivers' own CPU from a quiver summary (each arrow measures its own)."""
    results = summary["results"]
    assert isinstance(results, dict)
    return float(results.get("client_cpu_s") or 0.0)


SCENARIO: Final = Scenario(
    name="workers",
    help="aggregate msg/s of 1, 2, 4 queues with --workers 1 and 2, server CPU per message",
    columns=COLUMNS,
    add_arguments=add_arguments,
    run=run,
)
