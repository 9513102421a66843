"""``sluicegate serve --workers N``: a supervisor and N worker processes on one port (issue 35).

Each worker is a whole server (its reactor, its log in ``<data_dir>/worker-K/``), forked from
the supervisor before any thread exists. All listen on one port with ``SO_REUSEPORT``, and the
kernel spreads new connections over them; the supervisor holds the port bound (never
listening, so it is never handed a connection) for as long as it runs, so a restarted worker
finds it free and a port chosen with ``:0`` stays the server's. The supervisor waits for
signals only: a worker that dies is forked again and recovers its log while the others serve
on; SIGTERM or SIGINT is passed to every worker, and those still running after
``shutdown_timeout`` (and the watchdog's margin) are killed.

Every pair of workers shares a channel, a socket pair made here. At start every pair's is made
before the first fork and each worker inherits its ends, so each serves holding a channel to
every other (one forked first would otherwise get its ends only after it serves, and refuse
what needs another worker meanwhile). A worker forked again later inherits a fresh channel to
every worker that serves, whose end is handed over its control socket (``SCM_RIGHTS``); no
worker ever holds another's end (its death is seen as the end of the stream). A worker
that ends a channel for a protocol error says so on its control socket, and the pair gets a
fresh one the same way, after a pause (session/channel/remakes.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.durability import LOG_DIRECTORY
from sluicegate.gateway.proton.parent_death import end_with_parent
from sluicegate.gateway.queue_homes_file import PLACEMENT_FILE
from sluicegate.queues.queue_homes import Homes, HomesDamaged
from sluicegate.session.channel.remakes import Remakes, pair_of

log = logging.getLogger("sluicegate.supervisor")

_SIGNALS: Final = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
# Seconds the supervisor sleeps in sigtimedwait between looks at the workers' ready pipes.
_POLL: Final = 0.2
# Seconds before a worker that failed to start again is forked once more, doubled up to the
# cap at each failure in a row: a damaged log costs one attempt per half minute, not a loop.
RESTART_PAUSE: Final = 0.5
MAX_RESTART_PAUSE: Final = 30.0
# Seconds past shutdown_timeout the supervisor waits before it kills the workers still running:
# each has a watchdog of its own one second past it (cli/serve.py), so this is only
# for a worker that is stuck beyond its own watchdog.
KILL_MARGIN: Final = 2.0

# Stranded queues named in the refusal to start; the rest are counted.
_NAMED: Final = 10

# The control message that comes with a channel's socket: the other worker's index and the
# channel's serial number. A worker sends the same back when it ends that channel for a
# protocol error, asking for a new one; the serial tells a late report from a current one.
CHANNEL: Final = struct.Struct("<II")
# Bytes of reports read from a worker's control socket at once.
_REPORTS: Final = CHANNEL.size * 64


@dataclass
class WorkerChannels:
    """What a worker is handed by its supervisor: its index, one socket per other worker
    serving when it was forked, and the control socket the later ones arrive on."""

    index: int
    workers: int
    # The server's data directory, where the workers' shared placement file is.
    root: Path
    channels: dict[int, socket.socket] = field(default_factory=dict)
    # Each channel's serial number, by the other worker's index.
    serials: dict[int, int] = field(default_factory=dict)
    control: socket.socket | None = None


# Runs one worker's server with its config until it stops; calls ``ready`` once it serves.
ServeWorker = Callable[[ServerConfig, Callable[[], None], WorkerChannels], int]


def worker_dir(data_dir: Path, index: int) -> Path:
    """Where worker ``index`` keeps its log."""
    return data_dir / f"worker-{index}"


def worker_index(config: ServerConfig) -> int | None:
    """Which worker a server with ``config`` is (its data directory says), or None if it is a
    server of its own."""
    name = config.data_dir.name
    if config.workers == 1 or not re.fullmatch(r"worker-\d+", name):
        return None
    return int(name.removeprefix("worker-"))


def node_name(config: ServerConfig) -> str:
    """The server's node name before ``@host``: RabbitMQ's ``rabbit``, and for a worker
    ``rabbit-worker-K``, so that a queue's leader names the worker it lives on."""
    index = worker_index(config)
    return "rabbit" if index is None else f"rabbit-worker-{index}"


def layout_error(config: ServerConfig) -> str | None:
    """Why ``data_dir`` cannot be served with ``config.workers`` workers, if it cannot.

    A single server's log and the workers' logs never mix: serving one layout with the other
    would hide every message of the other from clients, so the server refuses to start.
    """
    data_dir = config.data_dir
    if config.workers > 1 and (data_dir / LOG_DIRECTORY).exists():
        return (
            f"{data_dir} holds the log of a single server; it cannot be served with "
            f"workers = {config.workers} (use another data_dir)"
        )
    if config.workers == 1 and data_dir.is_dir():
        workers = sorted(path.name for path in data_dir.glob("worker-*") if path.is_dir())
        if workers:
            return (
                f"{data_dir} holds the logs of {len(workers)} workers ({', '.join(workers)}); "
                "serve it with that many workers"
            )
    if config.workers > 1:
        return _stranded(data_dir / PLACEMENT_FILE, config.workers)
    return None


def _stranded(placement: Path, workers: int) -> str | None:
    """Why queues recorded in ``placement`` cannot be served by ``workers`` workers: some live
    on a worker beyond them, whose log no worker would read (queues/queue_homes.py)."""
    try:
        text = placement.read_text()
    except FileNotFoundError:
        return None
    try:
        stranded = Homes.replay(text, workers).stranded()
    except HomesDamaged as error:
        return f"{placement} is damaged: {error}"
    if not stranded:
        return None
    named = ", ".join(
        f"'{name}' (vhost '{vhost}', worker {home})" for vhost, name, home in stranded[:_NAMED]
    )
    more = f" and {len(stranded) - _NAMED} more" if len(stranded) > _NAMED else ""
    needed = max(home for _, _, home in stranded) + 1
    return (
        f"{len(stranded)} queues live on workers beyond the {workers} asked for: {named}{more}; "
        f"serve it with at least {needed} workers (their messages are in those workers' logs), "
        f"or stop it and move them: sluicegate placement move --to-workers {workers} "
        f"{placement.parent}"
    )


def worker_config(
    config: ServerConfig, index: int, port: int, tls_port: int | None
) -> ServerConfig:
    """Worker ``index``'s share of ``config``: its own log, the shared port, its part of the
    server-wide limits; only worker 0 serves the metrics endpoint and the HTTP API."""
    workers = config.workers
    changes: dict[str, object] = {
        "listen": _address(config.host, port),
        "data_dir": worker_dir(config.data_dir, index),
        "memory_budget": max(1, config.memory_budget // workers),
        "max_unfinished_total_size": config.max_unfinished_total_size // workers,
        "max_endpoints_size": config.max_endpoints_size // workers,
        "max_connections": max(1, config.max_connections // workers)
        if config.max_connections
        else 0,
    }
    if tls_port is not None:
        changes["tls_listen"] = _address(config.tls_listen.rpartition(":")[0], tls_port)
    if index:
        # Worker 0 serves the configured endpoint and adds the others' pages, which they
        # serve on loopback ports of their own (gateway/worker_metrics.py).
        changes["metrics_listen"] = "127.0.0.1:0" if config.metrics_address else "off"
        changes["http_api_listen"] = "off"
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def _address(host: str, port: int) -> str:
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reserve(host: str, port: int) -> socket.socket:
    """The port bound with SO_REUSEPORT and never listened on: the workers' sockets join it."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


@dataclass
class _Worker:
    """One worker process as the supervisor tracks it."""

    index: int
    config: ServerConfig
    pid: int = 0
    # The read end of the pipe it writes one byte to once it serves; -1 once it did.
    ready: int = -1
    started: float = 0.0
    # Failures to start in a row, and when to fork it again after one.
    failures: int = 0
    retry_at: float | None = None
    restarts: int = 0
    # The supervisor's end of its control socket, and a report read from it in part.
    control: socket.socket | None = None
    reports: bytes = b""


class Supervisor:
    """Forks the workers, restarts the ones that die, stops them all on SIGTERM."""

    def __init__(self, config: ServerConfig, serve_worker: ServeWorker) -> None:
        self.config = config
        self._serve_worker = serve_worker
        self._reserved: list[socket.socket] = []
        self.workers: list[_Worker] = []
        self.port = 0
        self.tls_port: int | None = None
        self.remakes = Remakes()
        # The channels made at start, by (worker, peer): that worker's end, the serial number.
        self._starting: dict[tuple[int, int], tuple[socket.socket, int]] = {}

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit status."""
        config = self.config
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            reserved = _reserve(config.host, config.port)
            self._reserved.append(reserved)
            self.port = reserved.getsockname()[1]
            if config.tls_cert_file is not None:
                host, _, port = config.tls_listen.rpartition(":")
                tls = _reserve(host, int(port))
                self._reserved.append(tls)
                self.tls_port = tls.getsockname()[1]
        except OSError as error:
            print(
                f"sluicegate: listen: cannot listen on {config.listen}: {error.strerror}",
                file=sys.stderr,
            )
            return 1
        self.workers = [
            _Worker(index, worker_config(config, index, self.port, self.tls_port))
            for index in range(config.workers)
        ]
        for one in self.workers:
            for other in self.workers[one.index + 1 :]:
                mine, theirs, serial = self._channel(one, other)
                self._starting[one.index, other.index] = (mine, serial)
                self._starting[other.index, one.index] = (theirs, serial)
        for worker in self.workers:
            self._fork(worker)
        for worker in self.workers:
            if not self._await_ready(worker):
                print(f"sluicegate: worker {worker.index} did not start", file=sys.stderr)
                self._stop()
                return 1
        print(f"sluicegate listening on amqp://{config.host}:{self.port}", flush=True)
        if self.tls_port is not None:
            host = config.tls_listen.rpartition(":")[0]
            print(f"sluicegate listening on amqps://{host}:{self.tls_port}", flush=True)
        while True:
            received = signal.sigtimedwait(_SIGNALS, _POLL)
            if received is not None and received.si_signo != signal.SIGCHLD:
                return self._stop()
            self._reap()
            self._poll_ready()
            self._retry()
            self._poll_reports()
            self._remake()

    # -- workers --------------------------------------------------------------------------

    def _fork(self, worker: _Worker) -> None:
        read, write = os.pipe()
        control, its_control = socket.socketpair()
        channels = WorkerChannels(
            worker.index, self.config.workers, self.config.data_dir, control=its_control
        )
        # A channel to every worker that serves (or is starting): this one inherits its end.
        theirs: list[tuple[_Worker, socket.socket, int]] = []
        for other in self.workers:
            made = self._starting.pop((worker.index, other.index), None)
            if made is not None:
                channels.channels[other.index], channels.serials[other.index] = made
            elif other is not worker and other.pid:
                mine, their, serial = self._channel(worker, other)
                channels.channels[other.index] = mine
                channels.serials[other.index] = serial
                theirs.append((other, their, serial))
        pid = os.fork()
        if pid == 0:
            os.close(read)
            control.close()
            for _, their, _ in theirs:
                their.close()
            self._become_worker(worker, write, channels)
        os.close(write)
        its_control.close()
        for mine in channels.channels.values():
            mine.close()
        for other, their, serial in theirs:
            self._hand(other, worker.index, serial, their)
        if worker.control is not None:
            worker.control.close()
        worker.control = control
        worker.reports = b""
        worker.pid = pid
        worker.ready = read
        worker.started = time.monotonic()
        worker.retry_at = None

    def _channel(self, one: _Worker, other: _Worker) -> tuple[socket.socket, socket.socket, int]:
        """A new socket pair between two workers: ``one``'s end, ``other``'s, its serial."""
        mine, theirs = socket.socketpair()
        return mine, theirs, self.remakes.made(pair_of(one.index, other.index), time.monotonic())

    def _hand(self, worker: _Worker, peer: int, serial: int, end: socket.socket) -> None:
        """Send a running worker its end of a channel to ``peer`` (SCM_RIGHTS) and close the
        supervisor's copy: only the two workers hold the channel's ends."""
        assert worker.control is not None
        # One that died meanwhile gets a fresh channel when it is forked again.
        with contextlib.suppress(OSError):
            socket.send_fds(worker.control, [CHANNEL.pack(peer, serial)], [end.fileno()])
        end.close()

    def _become_worker(self, worker: _Worker, ready: int, channels: WorkerChannels) -> None:
        """In the child: run the worker's server and exit; never returns."""
        status = 1
        try:
            for sock in self._reserved:
                sock.close()
            # The ends of channels made at start for the workers forked after this one.
            for end, _ in self._starting.values():
                end.close()
            for other in self.workers:
                if other.ready >= 0:
                    os.close(other.ready)
                # Another worker's control socket (or this one's from its last life).
                if other.control is not None:
                    other.control.close()
            end_with_parent()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

            def serving() -> None:
                os.write(ready, b"!")
                os.close(ready)

            status = self._serve_worker(worker.config, serving, channels)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    def _await_ready(self, worker: _Worker) -> bool:
        """Block until the worker serves (True) or dies first (False)."""
        ok = os.read(worker.ready, 1) == b"!"
        os.close(worker.ready)
        worker.ready = -1
        if ok and worker.restarts:
            worker.failures = 0
            log.warning(
                "worker %d serves again (pid %d), recovered in %.2f s",
                worker.index,
                worker.pid,
                time.monotonic() - worker.started,
            )
        return ok

    def _poll_ready(self) -> None:
        """Take the word of the workers that serve now (a restarted one logs its recovery)."""
        pipes = {worker.ready: worker for worker in self.workers if worker.ready >= 0}
        if pipes:
            readable, _, _ = select.select(list(pipes), [], [], 0)
            for pipe in readable:
                self._await_ready(pipes[pipe])

    def _reap(self) -> None:
        """Fork again every worker that died; one that died before it served waits first."""
        for worker in self.workers:
            if worker.pid == 0:
                continue
            pid, status = os.waitpid(worker.pid, os.WNOHANG)
            if pid == 0:
                continue
            # Its pipe's writer is gone: reading it never blocks.
            served = worker.ready < 0 or self._await_ready(worker)
            worker.pid = 0
            worker.restarts += 1
            log.warning(
                "worker %d (pid %d) ended: %s; starting it again",
                worker.index,
                pid,
                _describe(status),
            )
            if served:
                self._fork(worker)
                continue
            worker.failures += 1
            pause = min(RESTART_PAUSE * 2 ** (worker.failures - 1), MAX_RESTART_PAUSE)
            worker.retry_at = time.monotonic() + pause

    def _retry(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.pid == 0 and worker.retry_at is not None and worker.retry_at <= now:
                self._fork(worker)

    def _poll_reports(self) -> None:
        """Read the workers' reports of channels they ended for a protocol error."""
        controls = {
            worker.control: worker
            for worker in self.workers
            if worker.pid and worker.control is not None
        }
        if not controls:
            return
        readable, _, _ = select.select(list(controls), [], [], 0)
        now = time.monotonic()
        for control in readable:
            worker = controls[control]
            try:
                data = control.recv(_REPORTS, socket.MSG_DONTWAIT)
            except OSError:
                # It died: the reaper forks it again with fresh channels.
                continue
            reports = worker.reports + data
            whole = len(reports) - len(reports) % CHANNEL.size
            worker.reports = reports[whole:]
            for peer, serial in CHANNEL.iter_unpack(reports[:whole]):
                if peer >= len(self.workers) or peer == worker.index:
                    log.error("worker %d reported a channel to no worker (%d)", worker.index, peer)
                    continue
                pause = self.remakes.broken(pair_of(worker.index, peer), serial, now)
                if pause is not None:
                    log.warning(
                        "worker %d ended its channel to worker %d for a protocol error; "
                        "a new one in %.1f s",
                        worker.index,
                        peer,
                        pause,
                    )

    def _remake(self) -> None:
        """Give each pair whose channel is due a new one, handed to both as to a worker that
        was restarted; a pair with a worker that is not running gets one when it is forked."""
        for pair in self.remakes.due(time.monotonic()):
            one, other = (self.workers[index] for index in pair)
            if not (one.pid and other.pid):
                self.remakes.cancel(pair)
                continue
            mine, theirs, serial = self._channel(one, other)
            self._hand(one, other.index, serial, mine)
            self._hand(other, one.index, serial, theirs)
            log.warning("workers %d and %d have a new channel", one.index, other.index)

    def _stop(self) -> int:
        """SIGTERM to every worker; SIGKILL to those still running past the grace."""
        # A worker that came back since the last poll has its recovery logged before it stops
        # (a client may have been served by it within one poll interval).
        self._poll_ready()
        live = {worker.pid: worker for worker in self.workers if worker.pid}
        for pid in live:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.shutdown_timeout + KILL_MARGIN
        status = 0
        while live:
            for pid in list(live):
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    live.pop(pid).pid = 0
                    if code:
                        status = 1
            left = deadline - time.monotonic()
            if not live:
                break
            if left <= 0:
                for pid in live:
                    log.error("worker (pid %d) still running after shutdown_timeout; killed", pid)
                    _signal(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                return 1
            signal.sigtimedwait({signal.SIGCHLD}, min(left, _POLL))
        for sock in self._reserved:
            sock.close()
        return status


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
