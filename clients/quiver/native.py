"""The C arrows (``--impl c``): build ``c/arrow.c`` once, run each sender and receiver from it.

A Python arrow costs a core of its own at a few thousand messages a second, so on a small
machine the clients compete with the server they measure; the C arrow does the same work (the
messages, credit and outcomes of ``sender.py`` and ``receiver.py``) for a fraction of the CPU
(docs/workers.md, "Measured"). It is compiled on first use with the system's proton-c
(Debian's ``libqpid-proton11-dev``) into the user's cache, keyed by the source's and the flags'
hash, so an edit rebuilds it and nothing is written to the checkout.

``NativeArrow`` stands for one C process towards the runner: it starts and ends like a
``multiprocessing`` process and reads like its pipe, turning the C arrow's lines (the protocol at
the top of ``c/arrow.c``) into the Python arrows' reports and scoreboard slots.
"""

from __future__ import annotations

import hashlib
import os
import select
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Final

from sluicegate.clients.quiver.reports import (
    STOP,
    Failed,
    Ready,
    ReceiverDone,
    Report,
    Scoreboard,
    SenderDone,
)
from sluicegate.clients.quiver.settings import ArrowConfig

__all__ = ["IMPLEMENTATION", "NativeArrow", "NativeBuildError", "build"]

SOURCE: Final[Path] = Path(__file__).with_name("c") / "arrow.c"
COMPILER: Final[str] = "gcc"
CFLAGS: Final[tuple[str, ...]] = ("-O2", "-Wall", "-Wextra", "-Werror")
LIBRARIES: Final[tuple[str, ...]] = ("-lqpid-proton",)  # proton-c with its proactor
PACKAGE: Final[str] = "libqpid-proton11-dev"  # Debian's proton-c headers and library
IMPLEMENTATION: Final[str] = "proton-c (sluicegate's C arrow)"
NS_PER_S: Final[float] = 1e9
READ_SIZE: Final[int] = 65536  # far more than the lines a tick writes
NO_TIME: Final[int] = -1  # the C arrow's first/last time when it handled no message


class NativeBuildError(Exception):
    """The C arrow cannot be built here; the message says what to install."""


def cache_dir() -> Path:
    """Where built arrows are kept: ``$XDG_CACHE_HOME/sluicegate/quiver-c`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluicegate" / "quiver-c"


def build() -> Path:
    """The C arrow's executable, compiled now unless this source was compiled before.

    Several quivers may build at once (the workers benchmark starts one per queue): each
    compiles to its own temporary name and renames it into place, which is atomic.
    """
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((*CFLAGS, *LIBRARIES)).encode()).hexdigest()[:16]
    binary = cache_dir() / key / "arrow"
    if binary.exists():
        return binary
    compiler = shutil.which(COMPILER)
    if compiler is None:
        raise NativeBuildError(f"the C arrow needs {COMPILER} and {PACKAGE} (apt-get install)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"arrow.{os.getpid()}.tmp")
    command = [compiler, *CFLAGS, "-o", str(partial), str(SOURCE), *LIBRARIES]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        if "proton/" in built.stderr and "No such file" in built.stderr:
            raise NativeBuildError(
                f"the C arrow needs proton-c's headers: apt-get install {PACKAGE}"
            )
        first = next((line for line in built.stderr.splitlines() if line.strip()), "")
        raise NativeBuildError(f"cannot build {SOURCE.name}: {first}")
    os.replace(partial, binary)
    return binary


def arguments(binary: Path, config: ArrowConfig, latencies: str | None) -> list[str]:
    """The command line for one arrow, from the same instructions a Python arrow gets."""
    command = [
        str(binary),
        config.role,
        "--name",
        config.name,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--address",
        config.address,
        "--body-size",
        str(config.body_size),
        "--credit",
        str(config.credit),
        "--not-before",
        str(config.not_before_ns),
        "--timeout",
        f"{config.timeout:g}",
    ]
    if config.count is not None:
        command += ["--count", str(config.count)]
    if config.duration is not None:
        command += ["--duration", f"{config.duration:g}"]
    if config.durable:
        command.append("--durable")
    if config.presettled:
        command.append("--presettled")
    if latencies is not None:
        command += ["--latencies", latencies]
    return command


def optional_time(value: str) -> int | None:
    """A wall-clock time from a done line, ``None`` for the C arrow's ``-1``."""
    number = int(value)
    return None if number == NO_TIME else number


class NativeArrow:
    """One C arrow process, as the runner sees a process and its pipe.

    ``recv`` returns the next report, or ``None`` when what arrived was only progress (which it
    copies to the scoreboard); ``EOFError`` once the process closed its output.
    """

    def __init__(self, binary: Path, config: ArrowConfig, board: Scoreboard, slot: int) -> None:
        self.binary = binary
        self.config = config
        self.board = board
        self.slot = slot
        self.name = config.name
        self.popen: subprocess.Popen[bytes] | None = None
        self.pidfd = -1
        self.pending: list[Report] = []
        self.partial = b""
        self.latencies: str | None = None

    # -- the process side

    @property
    def pid(self) -> int | None:
        """The C process's id once started."""
        return None if self.popen is None else self.popen.pid

    @property
    def sentinel(self) -> int:
        """A descriptor that becomes readable when the process ends (a pidfd)."""
        return self.pidfd

    @property
    def exitcode(self) -> int | None:
        """The exit status once ended, as ``multiprocessing`` gives it (negative: a signal)."""
        return None if self.popen is None else self.popen.poll()

    def start(self) -> None:
        """Start the C process; a receiver gets a file for its latencies."""
        if self.config.role == "receiver":
            descriptor, self.latencies = tempfile.mkstemp(prefix="quiver-latencies-")
            os.close(descriptor)
        self.popen = subprocess.Popen(
            arguments(self.binary, self.config, self.latencies),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.pidfd = os.pidfd_open(self.popen.pid)

    def is_alive(self) -> bool:
        """The process was started and has not ended."""
        return self.popen is not None and self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for the process to end."""
        if self.popen is None:
            return
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        self.close()

    def terminate(self) -> None:
        """SIGTERM."""
        if self.is_alive():
            assert self.popen is not None
            self.popen.terminate()

    def kill(self) -> None:
        """SIGKILL."""
        if self.is_alive():
            assert self.popen is not None
            self.popen.kill()

    def close(self) -> None:
        """Release the pipes, the pidfd and the latency file of an ended process."""
        if self.popen is not None:
            for stream in (self.popen.stdin, self.popen.stdout):
                if stream is not None:
                    stream.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.latencies is not None:
            Path(self.latencies).unlink(missing_ok=True)
            self.latencies = None

    # -- the pipe side

    def output(self) -> IO[bytes]:
        """The process's stdout."""
        assert self.popen is not None
        assert self.popen.stdout is not None
        return self.popen.stdout

    def fileno(self) -> int:
        """What the runner waits on for reports: the process's stdout."""
        return self.output().fileno()

    def poll(self) -> bool:
        """A report is waiting, or output can be read without blocking."""
        if self.pending:
            return True
        if self.popen is None or self.output().closed:
            return False
        return bool(select.select([self.output()], [], [], 0)[0])

    def recv(self) -> Report | None:
        """The next report: one queued, else from what the process wrote since."""
        if not self.pending:
            chunk = os.read(self.fileno(), READ_SIZE)
            if not chunk:
                raise EOFError
            lines = (self.partial + chunk).split(b"\n")
            self.partial = lines.pop()
            for line in lines:
                self.take_line(line.decode(errors="replace"))
        return self.pending.pop(0) if self.pending else None

    def send(self, command: str) -> None:
        """The parent's stop, as a line on the process's stdin."""
        assert command == STOP
        assert self.popen is not None
        assert self.popen.stdin is not None
        self.popen.stdin.write(f"{command}\n".encode())
        self.popen.stdin.flush()

    def take_line(self, line: str) -> None:
        """Copy progress to the scoreboard; queue ready, done and failed as reports."""
        word, _, rest = line.partition(" ")
        fields = rest.split()
        try:
            match word:
                case "progress":
                    count, settled, latency = (int(f) for f in fields)
                    self.board.counts[self.slot] = count
                    self.board.settled[self.slot] = settled
                    if latency:
                        self.board.latency_ns[self.slot] = latency
                case "ready":
                    self.pending.append(Ready(self.name))
                case "failed":
                    self.pending.append(Failed(self.name, rest))
                case "done":
                    self.pending.append(self.done(fields))
                case _:
                    raise ValueError(line)
        except (ValueError, OSError) as error:
            self.pending.append(Failed(self.name, f"unexpected output from the C arrow: {error}"))

    def done(self, fields: list[str]) -> Report:
        """The totals of a done line; a receiver's latencies come from its file."""
        count, settled, first, last, cpu_ns = fields
        self.board.counts[self.slot] = int(count)
        cpu_s = int(cpu_ns) / NS_PER_S
        if self.config.role == "sender":
            first_ns, last_ns = optional_time(first), optional_time(last)
            return SenderDone(self.name, int(count), int(settled), first_ns, last_ns, cpu_s)
        assert self.latencies is not None
        return ReceiverDone(
            self.name,
            int(count),
            int(settled),
            optional_time(first),
            optional_time(last),
            Path(self.latencies).read_bytes(),
            cpu_s,
        )
