"""What the adversary's run watches: the server process, and a polite prober with a ledger.

The server runs as its own process (``python -m sluicegate serve``) so that its RSS is its own
and SIGTERM is a real signal; its log goes to a file the run reads for internal errors. The
prober is a proton client in a process of its own that does a round trip on its own queue,
round after round (on one connection, renewed every ``RECONNECT_EVERY`` rounds): each message
the server accepted goes into a ledger and leaves it when the prober consumes it, so at the end
every accepted message must have come back.
"""

from __future__ import annotations

import base64
import contextlib
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Channel
from pathlib import Path
from typing import Final

from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from support.adversary.starved import family, process_cpu_seconds, runqueue_wait, unexplained
from support.ports import free_port
from support.resident import resident
from support.stacks import python_stacks
from support.workers import worker_of

__all__ = ["ProberProcess", "Round", "ServerProcess"]

LISTENING: Final = re.compile(r"listening on amqp://127\.0\.0\.1:(\d+)")
# Characters of the budget's holders a breach report shows: the budget and its first holders.
HOLDERS_SHOWN: Final = 2_000
# Queues each further worker's breach report shows, the heaviest first.
HEAVIEST_SHOWN: Final = 8
READY_S: Final = 30.0  # a loaded machine takes seconds to import proton
# Longer than any served round (tens of milliseconds idle), far shorter than a stall.
ROUND_TIMEOUT_S: Final = 10.0
PROBER_QUEUE: Final = "adversary-prober"  # no step ever names it (steps.py uses adv-*)
# What the server logs when an event handler raised (gateway/server.py), when a worker ended
# and its supervisor starts it again (gateway/supervisor.py), and what ``faulthandler`` prints
# when a process dies of a fatal signal: a worker that ends loses what it held in memory, so
# its end is a breach even though the server goes on (seed 65852's run saw one only as a
# zombie in the server's family).
INTERNAL_ERROR: Final = re.compile(
    r"internal error|Traceback|worker \d+ \(pid \d+\) ended|^Fatal Python error"
)
ROUNDS_KEPT: Final = 256
ERROR_LINES: Final = 60  # an internal error's traceback through proton's dispatch and ours
# Lines kept before the first internal error: what the C library said before it aborted the
# process ("free(): double free detected"), which faulthandler's report comes after (seed
# 66159's worker aborted in proton, and its report began after that line).
LINES_BEFORE: Final = 3
# What tells a held prober's cause (the server idle, the prober waiting): the memory budget
# and whose reads are paused (gateway/metrics.py).
HOLD_GAUGES: Final = frozenset(
    {
        "sluicegate_memory_budget_used_bytes",
        "sluicegate_memory_budget_blocked",
        "sluicegate_memory_budget_publishing_level_bytes",
        "sluicegate_memory_budget_unfinished_bytes",
        "sluicegate_memory_budget_imported_bytes",
        "sluicegate_memory_budget_letters_sent_bytes",
        "sluicegate_memory_budget_letters_window_peak_bytes",
        "sluicegate_memory_budget_channel_sent_bytes",
        "sluicegate_memory_budget_channel_parked_bytes",
        "sluicegate_memory_budget_channel_given_back_total",
        "sluicegate_memory_budget_imports_given_back_total",
        "sluicegate_memory_budget_import_reserved_bytes",
        "sluicegate_consumer_links_stalled",
        "sluicegate_memory_budget_remote_publishers",
        "sluicegate_memory_budget_remote_publishers_held",
        "sluicegate_publisher_links_held",
        "sluicegate_connection_reads_paused_by_memory_budget",
        "sluicegate_connection_reads_paused_by_account",
        "sluicegate_connection_outgoing_pending_paused",
        "sluicegate_writer_bytes_pending",
        "sluicegate_connections",
    }
)
GAUGES_TIMEOUT_S: Final = 5.0  # the reactor serves the endpoint: a busy one answers late
SPAWN: Final = multiprocessing.get_context("spawn")  # no fork of a process with threads
# A round this late is a stall in the making: the server's stacks are read while it lasts
# (``py-spy dump``, which pauses each process for the milliseconds of its reading: read
# without pausing, a busy server's threads showed no frames at all, seed 71002), so that a
# breach shows where the server was, not only that it was busy (seed 72005: a 2 s pass whose
# cause its replay never showed again).
STALL_DUMP_S: Final = 0.8
# How long a killed prober's reader may take to read its pipe's end: it is there at once.
READER_JOIN_S: Final = 5.0
STALL_WATCH_S: Final = 0.1  # how often the watcher looks: a stall is dumped within 0.9 s
STALL_DUMP_TIMEOUT_S: Final = 10.0
STACKS_SHOWN: Final = 6_000  # characters of each process's stacks a breach report shows
# A round reuses the prober's connection and links; every this many rounds it opens new ones,
# so that a server that stops accepting or attaching shows too.
RECONNECT_EVERY: Final = 20


class ServerProcess:
    """``python -m sluicegate serve`` on a free port, with its log in a file."""

    def __init__(self, options: list[str]) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="sluicegate-adversary-")
        scratch = Path(self._scratch.name)
        self.log_path = scratch / "server.log"
        self._log = self.log_path.open("w")
        # ``-X faulthandler``: a process killed by a fatal signal (a crash in proton's C) logs
        # every thread's Python stack first, and its forked workers inherit it.
        command = [sys.executable, "-X", "faulthandler", "-m", "sluicegate", "serve"]
        command += ["--listen", "127.0.0.1:0"]
        self.metrics_port = free_port()
        metrics = f"127.0.0.1:{self.metrics_port}"
        command += ["--data-dir", str(scratch / "data"), "--metrics-listen", metrics]
        # RabbitMQ's port may be taken (by RabbitMQ, by another test's server): a free one, known,
        # so that a breach can show who holds the budget (:meth:`budget_holders`).
        self.http_api_port = free_port()
        command += ["--http-api-listen", f"127.0.0.1:{self.http_api_port}", *options]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, text=True
        )
        self.port = self._wait_ready()
        self._log_offset = 0

    def _wait_ready(self) -> int:
        found: list[int] = []

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                match = LISTENING.search(line)
                if match is not None:
                    found.append(int(match.group(1)))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(READY_S)
        if not found:
            tail = self.log_tail()  # before kill() removes the log with its directory
            self.kill()
            raise RuntimeError(f"the server did not start: {tail}")
        return found[0]

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss(self) -> int:
        """The server's resident set, in bytes (Linux's /proc): its workers' too.

        A worker that has just ended holds nothing: a zombie until its supervisor reaps it, or
        gone between the listing and the reading. Its end is reported from the log
        (:data:`INTERNAL_ERROR`), which its supervisor writes as it reaps it.
        """
        return sum(resident(member) or 0 for member in family(self.pid))

    def workers(self) -> list[int]:
        """The worker processes of a ``--workers N`` server by index (none for one process)."""
        pids = family(self.pid)[1:]
        return sorted(pids, key=worker_of) if pids else []

    def cpu_seconds(self) -> float:
        """CPU time the server has used (user + system)."""
        return process_cpu_seconds(self.pid)

    def new_errors(self) -> list[str]:
        """The log written since the last call from just before its first internal error on
        (:data:`LINES_BEFORE`), at most :data:`ERROR_LINES` lines after it: the traceback
        too, since the log goes with the run's directory (seed 69502's replay breached so, and
        its next replays did not)."""
        self._log.flush()
        with self.log_path.open() as log:
            log.seek(self._log_offset)
            text = log.read()
            self._log_offset = log.tell()
        lines = text.splitlines()
        first = next((n for n, line in enumerate(lines) if INTERNAL_ERROR.search(line)), None)
        if first is None:
            return []
        return lines[max(0, first - LINES_BEFORE) : first + ERROR_LINES]

    def hold_gauges(self) -> str:
        """The metrics that say what holds a prober while the server is idle, as one line:
        the server's (summed over its workers), then each worker's but the first's own, read
        from the port it leaves in ``worker-K/metrics.port`` (docs/workers.md), since one
        worker past its ceiling holds every publisher of its queues."""
        line = _gauges(self.metrics_port)
        data = Path(self._scratch.name) / "data"
        for port_file in sorted(data.glob("worker-*/metrics.port")):
            try:
                port = int(port_file.read_text().strip())
            except (OSError, ValueError):
                continue
            line += f" | {port_file.parent.name}: {_gauges(port)}; heaviest: {_heaviest(port)}"
        return line

    def handovers(self) -> dict[str, int]:
        """Connections handed to another worker, taken from one, and kept after an offer
        (``sluicegate_worker_connections_*_total``, every worker's added up): whether a run
        with hand-overs on made any."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=GAUGES_TIMEOUT_S) as response:
                text = response.read().decode(errors="replace")
        except OSError:
            return {}
        counts = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            kind = name.removeprefix("sluicegate_worker_connections_").removesuffix("_total")
            if kind in ("given", "taken", "kept") and name.endswith("_total"):
                counts[kind] = int(float(value))
        return counts

    def budget_holders(self) -> str:
        """The budget's holders as the console shows them (``/api/sluicegate/budget``), one
        line, cut at :data:`HOLDERS_SHOWN` characters: what a held prober waits behind."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_api_port}/api/sluicegate/budget",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
        )
        try:
            with urllib.request.urlopen(request, timeout=GAUGES_TIMEOUT_S) as response:
                text = response.read().decode(errors="replace")
        except OSError as error:
            return f"budget unavailable: {error}"
        return " ".join(text.split())[:HOLDERS_SHOWN]

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def terminate(self, grace: float) -> float | None:
        """SIGTERM; the seconds the server took to exit, or None if it did not within ``grace``."""
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - start

    def kill(self) -> None:
        """End the process whatever its state, and remove its files."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        self._scratch.cleanup()


@dataclass(frozen=True)
class Round:
    """One prober round: when it started and ended (monotonic), its error if it failed, and
    what the machine withheld from the server and the prober meanwhile (run-queue waits,
    support/adversary/starved.py) with the server's CPU over the round: measured by the prober
    at both ends of each round, since a round that ends after a step began during it."""

    start: float
    end: float
    error: str | None = None
    server_wait: float = 0.0
    prober_wait: float = 0.0
    server_cpu: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def unexplained(self) -> float:
        """Its seconds less what the machine withheld from the server or the prober."""
        return unexplained(self.seconds, self.server_wait, self.prober_wait)


@dataclass
class Ledger:
    """Bodies the server accepted from the prober and the prober has not consumed yet."""

    outstanding: deque[str] = field(default_factory=deque)
    consumed: int = 0


class LedgerProber(threading.Thread):
    """Round trips on ``/queues/adversary-prober`` until stopped, each one ``report``ed."""

    def __init__(self, port: int, server_pid: int, report: Callable[[str, object], None]) -> None:
        super().__init__(name="adversary-prober", daemon=True)
        self.url = f"amqp://127.0.0.1:{port}"
        self.server_pid = server_pid
        self.address = f"/queues/{PROBER_QUEUE}"
        self.ledger = Ledger()
        self.count = 0
        self._report = report
        self._links: tuple[BlockingConnection, BlockingSender, BlockingReceiver] | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            before = self._machine()
            start = time.monotonic()
            error = None
            try:
                self._round()
            except Exception as failure:
                error = repr(failure)
            end = time.monotonic()
            after = self._machine()
            waits = tuple(b - a for a, b in zip(before, after, strict=True))
            self._report("round", (start, end, error, *waits))
        self._disconnect()

    def _machine(self) -> tuple[float, float, float]:
        """The server's and this process's run-queue waits, and the server's CPU, so far."""
        server = self.server_pid
        return runqueue_wait(server), runqueue_wait(os.getpid()), process_cpu_seconds(server)

    def _round(self) -> None:
        if self._links is None or self.count % RECONNECT_EVERY == 0:
            self._disconnect()
            self._report("phase", "connecting")
            connection = BlockingConnection(self.url, timeout=ROUND_TIMEOUT_S)
            sender = connection.create_sender(self.address)
            receiver = connection.create_receiver(self.address, credit=1)
            self._links = (connection, sender, receiver)
        _, sender, receiver = self._links
        body = f"probe {self.count}"
        self.count += 1
        try:
            self._report("phase", "publishing")
            sender.send(Message(body=body))
            self.ledger.outstanding.append(body)  # send() returned: the server accepted it
            self._report("phase", "consuming")
            got = receiver.receive(ROUND_TIMEOUT_S)
            receiver.accept()
            receiver.flow(1)
        except Exception:
            self._disconnect()
            raise
        self._consumed(str(got.body))

    def _disconnect(self) -> None:
        if self._links is not None:
            with contextlib.suppress(Exception):  # the round's own error is what is reported
                self._links[0].close()
            self._links = None

    def _consumed(self, body: str) -> None:
        # A body consumed twice (its accept lost with a connection) is a duplicate, not a loss.
        if body in self.ledger.outstanding:
            self.ledger.outstanding.remove(body)
            self.ledger.consumed += 1

    def drain(self, timeout: float) -> list[str]:
        """After stopping: consume what is left on the queue; the accepted bodies never seen."""
        connection = BlockingConnection(self.url, timeout=timeout)
        try:
            receiver = connection.create_receiver(self.address, credit=100)
            while self.ledger.outstanding:
                try:
                    got = receiver.receive(timeout)
                except Exception:
                    break
                receiver.accept()
                self._consumed(str(got.body))
        finally:
            connection.close()
        return list(self.ledger.outstanding)

    def stop(self) -> None:
        self._stopping.set()
        self.join(ROUND_TIMEOUT_S * 3)


def _prober_process(port: int, server_pid: int, pipe: Channel) -> None:
    """The prober process: rounds until told to stop, then the drain's verdict."""
    sending = threading.Lock()

    def report(kind: str, value: object) -> None:
        with sending:
            pipe.send((kind, value))

    prober = LedgerProber(port, server_pid, report)
    prober.start()
    timeout = pipe.recv()
    prober.stop()
    try:
        report("drained", (prober.drain(timeout), None))
    except Exception as error:  # proton's Timeout and ConnectionException, among others
        report("drained", ([], repr(error)))


class ProberProcess:
    """The ledger prober in a process of its own, so that the adversary's work in this one
    (encoding 70 MiB messages, reading floods) never delays its rounds through the GIL.

    Its rounds come back over a pipe; monotonic time is the system's, the same in both.
    """

    def __init__(
        self, port: int, server_pid: int, watched: Callable[[], list[int]] | None = None
    ) -> None:
        self._pipe, self._theirs = SPAWN.Pipe()
        self._process = SPAWN.Process(
            target=_prober_process, args=(port, server_pid, self._theirs), daemon=True
        )
        self.rounds: deque[Round] = deque(maxlen=ROUNDS_KEPT)
        # The round since :meth:`take_latest` with the most time no run-queue wait explains:
        # a step runs for seconds, hundreds of rounds, and only the one after it was checked,
        # so a stall in the middle of a step went unseen but in the run's worst round.
        self._latest: Round | None = None
        self.count = 0
        self.phase = "starting"  # what the round under way is waiting for, for breach reports
        self._drained: tuple[list[str], str | None] | None = None
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="prober-reader", daemon=True)
        # The server's processes, whose stacks are read when a round is late, and the last
        # such reading: when it was taken and what it says.
        self._watched = watched
        self.stall: tuple[float, str] | None = None
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="prober-watcher", daemon=True)

    @property
    def pid(self) -> int:
        """The prober process's id, once started."""
        pid = self._process.pid
        assert pid is not None, "the prober is not started"
        return pid

    def start(self) -> None:
        self._process.start()
        self._reader.start()
        if self._watched is not None:
            self._watcher.start()

    def _watch(self) -> None:
        """Read the server's stacks once per late round, while it is late."""
        assert self._watched is not None
        dumped_after = None
        while not self._stopped.wait(STALL_WATCH_S):
            with self._changed:
                last = self.rounds[-1].end if self.rounds else None
            if last is None or last == dumped_after or time.monotonic() - last < STALL_DUMP_S:
                continue
            dumped_after = last
            # The prober's own too: a late round with the server idle (seed 71001) is the
            # prober's wait, or its own.
            stacks = "\n".join(
                f"--- pid {pid}\n" + python_stacks(pid, STALL_DUMP_TIMEOUT_S)[:STACKS_SHOWN]
                for pid in (*self._watched(), self.pid)
            )
            self.stall = (time.monotonic(), stacks)

    def stacks_since(self, moment: float) -> str:
        """The server's stacks read during a late round since ``moment``, if any were."""
        stall = self.stall
        if stall is None or stall[0] < moment:
            return ""
        return f"; the server's stacks {stall[0] - moment:.1f} s in: {stall[1]}"

    def _read(self) -> None:
        while True:
            try:
                kind, value = self._pipe.recv()
            except (EOFError, OSError):
                return
            with self._changed:
                if kind == "round":
                    served = Round(*value)
                    self.rounds.append(served)
                    self.count += 1
                    latest = self._latest
                    if latest is None or served.unexplained > latest.unexplained:
                        self._latest = served
                elif kind == "phase":
                    self.phase = value
                else:
                    self._drained = value
                self._changed.notify_all()

    def take_latest(self) -> Round | None:
        """The slowest round since the last call, by its unexplained seconds."""
        with self._changed:
            latest, self._latest = self._latest, None
        return latest

    def served_after(self, moment: float, limit: float) -> Round | None:
        """The first round that ended after ``moment``; None if none did within ``limit`` s.

        A round in progress at ``moment + limit`` that has not ended since ``moment`` began
        before it, so it has taken longer than ``limit``: no answer is a breach either way.
        """
        deadline = moment + limit
        with self._changed:
            while True:
                served = next((r for r in self.rounds if r.end > moment), None)
                if served is not None:
                    return served
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)

    def finish(self, timeout: float) -> list[str]:
        """Stop the rounds and drain the queue: the accepted bodies that never came back.

        ``RuntimeError`` if the prober could not stop or drain.
        """
        self._pipe.send(timeout)
        with self._changed:
            self._changed.wait_for(
                lambda: self._drained is not None, ROUND_TIMEOUT_S * 3 + timeout * 2
            )
            drained = self._drained
        if drained is None:
            raise RuntimeError("the prober did not stop and drain")
        lost, error = drained
        if error is not None:
            raise RuntimeError(f"the final drain failed: {error}")
        return lost

    def kill(self) -> None:
        """End the prober process whatever its state."""
        self._stopped.set()
        if self._process.pid is not None:  # started
            self._process.kill()
            self._process.join()
        # This process's copy of the prober's end first: the reader then reads the pipe's end
        # and returns. Closed under it, its read failed on a closed handle (a TypeError that
        # failed the test it ran in).
        self._theirs.close()
        if self._reader.is_alive():
            self._reader.join(READER_JOIN_S)
        self._pipe.close()


def _heaviest(port: int) -> str:
    """The :data:`HEAVIEST_SHOWN` queues of the metrics endpoint on ``port`` with the most
    bytes ready, and their consumers: what fills a worker whose budget the console of worker 0
    does not show."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=GAUGES_TIMEOUT_S) as response:
            text = response.read().decode(errors="replace")
    except OSError as error:
        return f"metrics unavailable: {error}"
    ready: dict[str, float] = {}
    consumers: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("} ")
        queue = re.search(r'queue="([^"]*)"', labels)
        if queue is None:
            continue
        if name == "sluicegate_queue_messages_ready_bytes":
            ready[queue.group(1)] = float(value)
        elif name == "sluicegate_queue_consumers":
            consumers[queue.group(1)] = float(value)
    heaviest = sorted(ready, key=ready.__getitem__, reverse=True)[:HEAVIEST_SHOWN]
    return ", ".join(f"{q}={ready[q]:.0f}/{consumers.get(q, 0):.0f}" for q in heaviest)


def _gauges(port: int) -> str:
    """:data:`HOLD_GAUGES` of the metrics endpoint on ``port``, as one line."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=GAUGES_TIMEOUT_S) as response:
            text = response.read().decode(errors="replace")
    except OSError as error:
        return f"metrics unavailable: {error}"
    kept = []
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in HOLD_GAUGES:
            kept.append(f"{name.removeprefix('sluicegate_')}={value}")
    return ", ".join(kept)
