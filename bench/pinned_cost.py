"""``python -m bench.channel_cost --pinned``: server CPU per message, local and across workers.

Issue 35's bound is a cross-worker consumer's server CPU per message against a local one's.
``bench/scenarios/workers.py`` cannot choose where the kernel puts quiver's connections, so a
message there crosses zero, one or two times. Here the clients are this process's own (a
``Pump`` each, clients/pump.py) and each connection is pinned: a socket is opened until the
worker that accepted it is the wanted one, told by which worker process holds the accepted
socket's inode (``/proc``, as ``ss -p`` would). Four servers, in one run so that they share the
machine's load:

- ``1 worker``: ``--workers 1``, queue and clients in its one process;
- ``2 workers, local``: queue and clients on worker 0 (what running workers costs by itself);
- ``2 workers, crossing``: clients on worker 0, the queue on worker 1 (``--worker-handover
  false``);
- ``2 workers, handed over``: the same, but the connection goes to worker 1 at its first ATTACH
  (docs/workers.md#handing-a-connection-over).

Each case publishes ``messages`` to an empty queue with no consumer, in windows of
:data:`PUBLISH_WINDOW` (the publish phase: every message crosses once in a ``Publish`` frame
and comes back confirmed), then consumes them all in windows of :data:`CONSUME_WINDOW` (the
consume phase: credit requests, deliveries, settlements). The figure is the utime+stime of the
server's worker processes (``/proc/PID/stat``; the supervisor, which serves no message, is left
out) over each phase, per message: the clients' own CPU is not in it.

The four servers run side by side and take turns: a round publishes on each in turn, then
consumes on each in turn, the order reversed from one round to the next, so that the cases a
ratio compares ran seconds apart. On a shared machine a neighbour's load moves a server's CPU
per message too (caches, frequency, and how many messages each reactor pass carries), by a
fifth from one minute to the next; within a round it moves both sides of a ratio alike. Each
ratio is therefore taken within a round, and the table gives the median of the rounds' ratios
and their range, beside each case's best and median.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Final

from proton import Message

from bench.servers import Server, start_sluicegate, stop
from sluicegate.clients.capi import PN_ACCEPTED, ffi, lib, link_pointer
from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver import procstat
from sluicegate.queues.queue_homes import proposed_home

# quiver's body size: the figures are for 100-byte bodies.
BODY_SIZE: Final = 100
# Messages the publisher sends before it waits for all of them to be accepted: within the 170
# unconfirmed a publisher's link may hold (docs/inbound-flow-control.md), so credit never
# decides the batches. Windows rather than a steady stream make the batches (and so the
# reactor passes and channel frames per message) the same from run to run, whatever the
# machine's load.
PUBLISH_WINDOW: Final = 100
# Credit the consumer grants at a time, accepting the window's messages together once all
# arrived: quiver's credit, in windows for the same reason.
CONSUME_WINDOW: Final = 1_000
# Connections opened before giving up reaching one worker: with two workers, 200 all landing
# on the other happen 1 time in 2**200.
ATTEMPTS: Final = 200
# Seconds without progress before a phase is declared stuck.
STALL_S: Final = 30.0
# Seconds a pass of the client waits for input.
PUMP_S: Final = 0.01


@dataclass(frozen=True)
class Case:
    """One server and where its queue lives (``home``) relative to the clients (worker 0)."""

    label: str
    workers: int
    home: int
    # Whether a connection may go to its queue's worker at its first ATTACH (docs/workers.md).
    handover: bool = False


CASES: Final = (
    Case("1 worker", 1, 0),
    Case("2 workers, local", 2, 0),
    Case("2 workers, crossing", 2, 1),
    Case("2 workers, handed over", 2, 1, handover=True),
)


@dataclass(frozen=True)
class Cost:
    """Server CPU µs per message of each phase."""

    publish: float
    consume: float


def workers_by_index(server: Server, workers: int) -> list[int]:
    """The server's worker pids, by worker index (the ``worker-K`` directory each holds)."""
    assert server.pid is not None
    if workers == 1:
        return [server.pid]
    pid = server.pid
    found: dict[int, int] = {}
    while len(found) < workers:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            for fd in Path(f"/proc/{child}/fd").iterdir():
                try:
                    match = re.search(r"/worker-(\d+)/", os.readlink(fd))
                except OSError:
                    continue
                if match is not None:
                    found[int(match.group(1))] = int(child)
                    break
        time.sleep(0.05)
    return [found[index] for index in range(workers)]


def _accepted_by(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """The pid among ``pids`` holding the server's end of the connection from ``client_port``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local = int(fields[1].rsplit(":", 1)[1], 16)
        remote = int(fields[2].rsplit(":", 1)[1], 16)
        if (local, remote) == (server_port, client_port):
            inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:
                continue
    return None


def pinned(server: Server, pids: list[int], wanted: int, name: str) -> Pump:
    """An AMQP connection that worker process ``wanted`` accepted."""
    for _ in range(ATTEMPTS):
        sock = socket.create_connection((server.host, server.port), timeout=10)
        mine = sock.getsockname()[1]
        deadline = time.monotonic() + 5
        owner = None
        while owner is None and time.monotonic() < deadline:
            owner = _accepted_by(server.port, mine, pids)
            if owner is None:
                time.sleep(0.01)
        if owner == wanted:
            pump = Pump.client(sock, name, server.host)
            pump.connection.open()
            return pump
        sock.close()
    raise RuntimeError(f"no connection reached worker process {wanted} in {ATTEMPTS} attempts")


def _until(pump: Pump, done: Any, what: str) -> None:
    deadline = time.monotonic() + STALL_S
    while not done():
        if pump.closed or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: stuck or closed ({pump.transport.condition})")
        pump.pump(PUMP_S)


def publish(pump: Pump, address: str, messages: int) -> None:
    """Send ``messages`` unsettled, a window at a time: the next window goes once every
    message of the last was accepted."""
    session = pump.connection.session()
    session.open()
    sender = session.sender(address)
    sender.target.address = address
    sender.open()
    link = link_pointer(sender)
    payload = Message(body=b"x" * BODY_SIZE).encode()
    data = ffi.from_buffer(payload)
    tag = bytearray(8)
    ctag = ffi.from_buffer(tag)
    unsettled: deque[Any] = deque()
    sent = 0
    deadline = time.monotonic() + STALL_S
    while sent < messages or unsettled:
        if pump.closed or time.monotonic() > deadline:
            raise RuntimeError(f"publish: stuck at {sent - len(unsettled)} of {messages}")
        if not unsettled and lib.pn_link_credit(link) >= min(PUBLISH_WINDOW, messages - sent):
            for _ in range(min(PUBLISH_WINDOW, messages - sent)):
                sent += 1
                tag[:] = sent.to_bytes(8, "little")
                delivery = lib.pn_delivery(link, (8, ctag))
                lib.pn_link_send(link, data, len(payload))
                lib.pn_link_advance(link)
                unsettled.append(delivery)
        pump.pump(PUMP_S)
        while unsettled and lib.pn_delivery_remote_state(unsettled[0]) != 0:
            if lib.pn_delivery_remote_state(unsettled[0]) != PN_ACCEPTED:
                raise RuntimeError("publish: a message was not accepted")
            lib.pn_delivery_settle(unsettled.popleft())
            deadline = time.monotonic() + STALL_S
    sender.close()
    session.close()
    _until(pump, lambda: bool(sender.state & sender.REMOTE_CLOSED), "publisher's detach")


def consume(pump: Pump, address: str, messages: int) -> None:
    """Receive ``messages``, a window of credit at a time: each window's messages are
    accepted together once all arrived, then the next window is granted."""
    session = pump.connection.session()
    session.open()
    receiver = session.receiver(address)
    receiver.source.address = address
    receiver.open()
    link = link_pointer(receiver)
    received = 0
    buffer = ffi.new("char[]", 64 * 1024)
    deadline = time.monotonic() + STALL_S
    while received < messages:
        window = min(CONSUME_WINDOW, messages - received)
        lib.pn_link_flow(link, window)
        taken: list[Any] = []
        while len(taken) < window:
            if pump.closed or time.monotonic() > deadline:
                raise RuntimeError(f"consume: stuck at {received + len(taken)} of {messages}")
            pump.pump(PUMP_S)
            delivery = lib.pn_link_current(link)
            while (
                delivery != ffi.NULL
                and lib.pn_delivery_readable(delivery)
                and not lib.pn_delivery_partial(delivery)
            ):
                lib.pn_link_recv(link, buffer, 64 * 1024)
                lib.pn_link_advance(link)
                taken.append(delivery)
                deadline = time.monotonic() + STALL_S
                delivery = lib.pn_link_current(link)
        for delivery in taken:
            lib.pn_delivery_update(delivery, PN_ACCEPTED)
            lib.pn_delivery_settle(delivery)
        received += window
    receiver.close()
    session.close()
    _until(pump, lambda: bool(receiver.state & receiver.REMOTE_CLOSED), "consumer's detach")


@contextmanager
def serving(workers: int, handover: bool = False) -> Iterator[tuple[Server, list[int]]]:
    """A fresh server of ``workers`` and its worker pids by index; without ``handover`` a
    client stays on the worker that accepted it, so the crossing case crosses."""
    options = ["--workers", str(workers)]
    if workers > 1:
        options += ["--worker-handover", "true" if handover else "false"]
    with tempfile.TemporaryDirectory(prefix="sluicegate-pinned-") as scratch:
        server = start_sluicegate("sluicegate", options, Path(scratch) / "d")
        try:
            yield server, workers_by_index(server, workers)
        finally:
            stop(server)


def queue_on(home: int, workers: int) -> str:
    """A queue name of the default virtual host placed on worker ``home``."""
    return next(
        name
        for name in (f"pinned-{n}" for n in range(100_000))
        if proposed_home("/", name, workers) == home
    )


@dataclass(frozen=True)
class Running:
    """A case's server's worker pids by index, its client (on worker 0) and queue."""

    case: Case
    pids: list[int]
    pump: Pump
    address: str


@contextmanager
def running(case: Case) -> Iterator[Running]:
    """``case``'s server with its client connected, the queue declared and the channel warm."""
    with serving(case.workers, case.handover) as (server, pids):
        address = server.address(queue_on(case.home, case.workers))
        pump = pinned(server, pids, pids[0], "pinned-bench")
        try:
            _until(pump, lambda: bool(pump.connection.state & pump.connection.REMOTE_ACTIVE),
                   "open")  # fmt: skip
            # One message each way first: the queue is declared and placed, the channel warm.
            publish(pump, address, 1)
            consume(pump, address, 1)
            yield Running(case, pids, pump, address)
        finally:
            pump.connection.close()
            pump.flush()
            pump.close()


def workers_ticks(pids: list[int]) -> int:
    """CPU clock ticks (user and system) the worker processes ``pids`` used so far."""
    return sum(procstat.parse_stat_ticks(Path(f"/proc/{pid}/stat").read_text()) for pid in pids)


def phase(live: Running, act: Callable[[Pump, str, int], None], messages: int) -> float:
    """The workers' CPU µs per message while ``act`` moves ``messages`` on ``live``."""
    before = workers_ticks(live.pids)
    act(live.pump, live.address, messages)
    return (workers_ticks(live.pids) - before) * 1e6 / procstat.TICKS_PER_S / messages


def measure(cases: Sequence[Case], messages: int, rounds: int) -> dict[Case, list[Cost]]:
    """Each case's publish and consume CPU per message in each of ``rounds`` rounds, the cases
    taking turns within a round (in the reverse order every other round)."""
    costs: dict[Case, list[Cost]] = {case: [] for case in cases}
    with ExitStack() as stack:
        live = [stack.enter_context(running(case)) for case in cases]
        for number in range(rounds):
            order = live if number % 2 == 0 else live[::-1]
            published = {each.case: phase(each, publish, messages) for each in order}
            consumed = {each.case: phase(each, consume, messages) for each in order}
            for case in cases:
                costs[case].append(Cost(published[case], consumed[case]))
    return costs


def ratios(costs: Sequence[float], base: Sequence[float]) -> tuple[float, float, float]:
    """The median, lowest and highest of the rounds' ratios of ``costs`` to ``base`` (the
    same round's)."""
    each = [cost / against for cost, against in zip(costs, base, strict=True)]
    return median(each), min(each), max(each)


def _cell(costs: Sequence[float], base: Sequence[float]) -> str:
    """A case's best and median, then the median of its ratios to ``base`` and their range."""
    middle, low, high = ratios(costs, base)
    return f"{min(costs):.1f}, {median(costs):.1f} | {middle:.2f} ({low:.2f} to {high:.2f})"


def report(messages: int, rounds: int) -> list[str]:
    """The Markdown table of every case (best and median of the rounds, the median of the
    rounds' ratios to one worker's and their range), with the load average before and after."""
    load = os.getloadavg()[0]
    results = measure(CASES, messages, rounds)
    lines = [
        f"{messages} messages of {BODY_SIZE} bytes per phase, {rounds} rounds in turns; "
        f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after",
        "",
        "| case | publish µs/msg best, median | vs 1 worker, median of rounds (range) | "
        "consume µs/msg best, median | vs 1 worker, median of rounds (range) |",
        "|---|---:|---:|---:|---:|",
    ]
    base = results[CASES[0]]
    for case, costs in results.items():
        publish_cell = _cell([cost.publish for cost in costs], [cost.publish for cost in base])
        consume_cell = _cell([cost.consume for cost in costs], [cost.consume for cost in base])
        lines.append(f"| {case.label} | {publish_cell} | {consume_cell} |")
    return lines
