"""One measurement: start the sender and receiver processes, watch them, gather their totals.

Each sender and receiver is its own process (``spawn``, so none shares a GIL or a forked proton
state with another; with ``--impl c``, the C arrow's, see ``native``). The parent never touches
a message: it reads the shared scoreboard every ``POLL_S`` to decide when the receivers have
everything and whether anything still moves, prints a status row every ``STATUS_PERIOD_S``, and
turns any child's failure into one line.
"""

from __future__ import annotations

import multiprocessing
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection as Channel
from multiprocessing.connection import wait
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any, Final, Protocol, TextIO

from sluicegate.clients.children import Ending, end
from sluicegate.clients.quiver import native, procstat, receiver, sender
from sluicegate.clients.quiver.native import NativeArrow, NativeBuildError
from sluicegate.clients.quiver.procstat import ProcSample
from sluicegate.clients.quiver.reports import (
    STOP,
    Failed,
    Ready,
    ReceiverDone,
    Report,
    Scoreboard,
    SenderDone,
)
from sluicegate.clients.quiver.settings import ArrowConfig, Settings, plan_arrows
from sluicegate.clients.quiver.stats import (
    NS_PER_MS,
    ProcessUsage,
    Results,
    Span,
    cpu_percent,
    merge_spans,
    status_heading,
    status_row,
    summarize,
)

__all__ = ["RunError", "measure"]

STATUS_PERIOD_S: Final[float] = 2.0  # often enough to watch a run, long enough for steady rates
POLL_S: Final[float] = 0.1  # the children publish at 10 Hz; looking more often finds nothing new
EXIT_GRACE_S: Final[float] = 5.0  # a child that reported but has not closed by then is stuck

Entry = Callable[[ArrowConfig, Channel, Scoreboard, int], None]


class RunError(Exception):
    """The run cannot finish; the message is the one line the user sees."""


class ArrowProcess(Ending, Protocol):
    """A sender or receiver process: ``multiprocessing``'s, or a ``NativeArrow``."""

    @property
    def sentinel(self) -> int:
        """A descriptor that becomes readable when the process ends."""

    @property
    def exitcode(self) -> int | None:
        """The exit status once ended."""

    def start(self) -> None:
        """Start the process."""


class ArrowChannel(Protocol):
    """The pipe to a sender or receiver: ``multiprocessing``'s, or a ``NativeArrow``.

    ``recv`` returns a report, or ``None`` when what arrived held none (the C arrow's progress).
    """

    def fileno(self) -> int:
        """What to wait on for reports."""

    def poll(self) -> bool:
        """A report can be read without blocking."""

    def recv(self) -> Any:
        """The next report."""

    def send(self, obj: Any) -> None:
        """The parent's stop."""


@dataclass
class Child:
    """A sender or receiver process as the parent sees it."""

    config: ArrowConfig
    slot: int
    process: ArrowProcess
    channel: ArrowChannel
    ready: bool = False
    hung_up: bool = False
    done: SenderDone | ReceiverDone | None = None
    sample: ProcSample | None = None


class Measurement:
    """The parent's side of one run."""

    def __init__(self, settings: Settings, out: TextIO, binary: Path | None = None) -> None:
        self.settings = settings
        self.out = out
        self.binary = binary  # the C arrow, with --impl c
        self.context: SpawnContext = multiprocessing.get_context("spawn")
        sender_configs, receiver_configs = plan_arrows(settings, time.time_ns())
        self.board = Scoreboard(self.context, len(sender_configs) + len(receiver_configs))
        self.receivers = [self.spawn(c, i, receiver.main) for i, c in enumerate(receiver_configs)]
        offset = len(self.receivers)
        self.senders = [
            self.spawn(c, offset + i, sender.main) for i, c in enumerate(sender_configs)
        ]
        self.stop_sent = False

    @property
    def children(self) -> list[Child]:
        """Senders, then receivers: the order of the status columns."""
        return self.senders + self.receivers

    def spawn(self, config: ArrowConfig, slot: int, entry: Entry) -> Child:
        """Prepare a process (not started yet) and the pipe to it."""
        if self.binary is not None:
            arrow = NativeArrow(self.binary, config, self.board, slot)
            return Child(config=config, slot=slot, process=arrow, channel=arrow)
        ours, theirs = self.context.Pipe()
        process = self.context.Process(
            target=entry, args=(config, theirs, self.board, slot), name=config.name, daemon=True
        )
        return Child(config=config, slot=slot, process=process, channel=ours)

    def run(self) -> Results:
        """Start receivers, wait until they are ready, start senders, wait for everyone's totals."""
        for child in self.receivers:
            child.process.start()
        self.wait_until(lambda: all(c.ready for c in self.receivers), "receivers to attach")
        for child in self.senders:
            child.process.start()
        for child in self.children:
            self.usage(child, 0.0)  # the baseline for the first row's CPU
        started = last_status = time.monotonic()
        print(status_heading([c.config.name for c in self.children]), file=self.out, flush=True)
        counts = (0, 0)
        progress, moved = -1, started
        while not all(c.done is not None for c in self.children):
            self.pump(POLL_S)
            self.stop_receivers_when_complete()
            now = time.monotonic()
            if self.board.progress() != progress:
                progress, moved = self.board.progress(), now
            elif now - moved > self.settings.timeout:
                raise RunError(self.stalled(now - moved))
            if now - last_status >= STATUS_PERIOD_S:
                counts = self.print_status(now - started, counts, now - last_status)
                last_status = now
        self.join()
        for child in self.receivers:
            if isinstance(child.done, ReceiverDone) and child.done.stale:
                print(
                    f"{child.config.name} drained {child.done.stale:,} messages left over "
                    "from an earlier run",
                    file=self.out,
                )
        return self.results()

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Pump reports until ``condition`` holds or the timeout passes."""
        deadline = time.monotonic() + self.settings.timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RunError(f"timed out after {self.settings.timeout:g} s waiting for {what}")
            self.pump(POLL_S)

    def pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for reports or exits and take them in."""
        actions: dict[int, Callable[[], None]] = {}
        for child in self.children:
            if child.done is None and child.process.pid is not None:
                actions[child.process.sentinel] = partial(self.exited, child)
                if not child.hung_up:
                    actions[child.channel.fileno()] = partial(self.take, child)
        for ready in wait(list(actions), timeout):
            assert isinstance(ready, int)
            actions[ready]()

    def take(self, child: Child) -> None:
        """Handle one report from a child (or learn that it closed its end)."""
        if child.done is not None or child.hung_up:
            return  # what woke the wait was already taken in, with the exit
        try:
            report: Report | None = child.channel.recv()
        except EOFError:
            child.hung_up = True
            return
        match report:
            case Ready():
                child.ready = True
            case Failed(name=name, reason=reason):
                raise RunError(f"{name}: {reason}")
            case SenderDone() | ReceiverDone():
                child.done = report

    def exited(self, child: Child) -> None:
        """A child ended: take what it said last; without totals, it crashed."""
        while child.done is None and not child.hung_up and child.channel.poll():
            self.take(child)
        if child.done is None:
            child.process.join()
            raise RunError(f"{child.config.name} exited with status {child.process.exitcode}")

    def stop_receivers_when_complete(self) -> None:
        """Once all senders are done and the receivers hold all they will get, tell them."""
        if self.stop_sent or not all(isinstance(c.done, SenderDone) for c in self.senders):
            return
        if self.totals()[1] < self.expected():
            return
        self.stop_sent = True
        for child in self.receivers:
            if child.done is None:
                try:
                    child.channel.send(STOP)
                except OSError:
                    continue  # it is exiting after its own report; pump collects it

    def expected(self) -> int:
        """Messages the receivers should get: those accepted, or every one sent presettled."""
        done = [c.done for c in self.senders if isinstance(c.done, SenderDone)]
        if self.settings.presettled:
            return sum(d.sent for d in done)
        return sum(d.accepted for d in done)

    def totals(self) -> tuple[int, int]:
        """Messages sent and received so far, as last published."""
        return (
            self.board.total(range(len(self.receivers), len(self.children))),
            self.board.total(range(len(self.receivers))),
        )

    def stalled(self, idle_s: float) -> str:
        """The no-progress line: what moved until it stopped."""
        sent, received = self.totals()
        return (
            f"no progress for {idle_s:.1f} s (timeout {self.settings.timeout:g} s): "
            f"{sent:,} sent, {received:,} received"
        )

    def print_status(
        self, elapsed_s: float, before: tuple[int, int], period_s: float
    ) -> tuple[int, int]:
        """One status row; returns the counts it showed, for the next row's rates."""
        sent, received = self.totals()
        latencies = [self.board.latency_ns[c.slot] for c in self.receivers]
        usages = [self.usage(c, period_s) for c in self.children]
        row = status_row(
            elapsed_s,
            sent,
            (sent - before[0]) / period_s,
            received,
            (received - before[1]) / period_s,
            max(latencies) / NS_PER_MS if received else None,
            usages,
        )
        print(row, file=self.out, flush=True)
        return sent, received

    def usage(self, child: Child, period_s: float) -> ProcessUsage:
        """CPU over the last period and RSS now, from /proc."""
        previous, pid = child.sample, child.process.pid
        current = procstat.sample(pid) if child.done is None and pid is not None else None
        child.sample = current
        if current is None:
            return ProcessUsage(child.config.name, None, None)
        cpu = (
            None
            if previous is None
            else cpu_percent(previous.cpu_ticks, current.cpu_ticks, procstat.TICKS_PER_S, period_s)
        )
        return ProcessUsage(child.config.name, cpu, current.rss_bytes)

    def join(self) -> None:
        """Give each child a moment to close its connection, then make sure it is gone."""
        deadline = time.monotonic() + EXIT_GRACE_S
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
        self.terminate()

    def terminate(self) -> None:
        """End every child still running (on failure, interrupt, or a stuck close)."""
        for child in self.children:
            if child.process.pid is not None and child.process.is_alive():
                child.process.terminate()
        for child in self.children:
            end(child.process, EXIT_GRACE_S)
            if isinstance(child.process, NativeArrow):
                child.process.close()

    def results(self) -> Results:
        """Merge the children's totals into quiver's results."""
        sent = [c.done for c in self.senders if isinstance(c.done, SenderDone)]
        received = [c.done for c in self.receivers if isinstance(c.done, ReceiverDone)]
        cpu_s = sum(d.cpu_s for d in sent) + sum(d.cpu_s for d in received)
        latencies = array("q")
        for report in received:
            latencies.frombytes(report.latencies)
        return summarize(
            merge_spans([Span(d.sent, d.first_ns, d.last_ns) for d in sent]),
            merge_spans([Span(d.received, d.first_ns, d.last_ns) for d in received]),
            None if self.settings.presettled else sum(d.accepted for d in sent),
            latencies,
            cpu_s,
        )


def measure(settings: Settings, out: TextIO) -> Results:
    """Run one measurement, writing status rows to ``out``; raise ``RunError`` on failure."""
    binary = None
    if settings.impl == "c":
        try:
            binary = native.build()
        except NativeBuildError as error:
            raise RunError(str(error)) from None
    measurement = Measurement(settings, out, binary)
    try:
        return measurement.run()
    finally:
        measurement.terminate()
