"""The servers a scenario runs against: a sluicegate it starts itself, or any AMQP 1.0 URL.

A started sluicegate is a subprocess (``python -m sluicegate serve --listen 127.0.0.1:0``), ready
when it prints its address line; it is stopped with SIGTERM, by its own pid. A server given by
URL is only reached over AMQP; its RSS is sampled when the user gives its ``--pid``.
A started server that refuses an option the scenario needs (a feature not built yet) is reported
as ``MissingFeature`` naming the feature, never replaced by something else.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_ADDRESS_PREFIX",
    "START",
    "MissingFeature",
    "Server",
    "ServerError",
    "Target",
    "free_port",
    "parse_target",
    "running",
    "start_sluicegate",
    "stop",
]

START: Final[str] = "start"  # the URL that means "start a sluicegate for each run"
DEFAULT_ADDRESS_PREFIX: Final[str] = "/queues/"  # RabbitMQ 4's v2 address format, sluicegate's
READY_TIMEOUT_S: Final[float] = 30.0  # a loaded machine takes a few seconds to import proton
AMQP_PORT: Final[int] = 5672  # IANA's, when a URL names none
STOP_TIMEOUT_S: Final[float] = 20.0  # the server's own graceful shutdown plus a margin
_ADDRESS_LINE = re.compile(r"listening on amqp://(?P<host>[^\s:]+|\[[^\]]+\]):(?P<port>\d+)")
# What a sluicegate that refuses an option lacks (the issue that brings it).
FEATURES: Final[dict[str, str]] = {
    "--memory-budget": "the server-wide memory budget (issue 5, inbound flow control)",
    "--metrics-listen": "the Prometheus metrics endpoint (issue 10, operations)",
}
_UNKNOWN_OPTION = re.compile(r"unrecognized arguments: (?P<option>--[\w-]+)")


class ServerError(RuntimeError):
    """A server could not be started or reached; the message is one line for the user."""


class MissingFeature(ServerError):
    """The server lacks a feature the scenario measures."""


@dataclass(frozen=True, slots=True)
class Target:
    """What ``--url``/``--compare`` names: a server and where its RSS can be read."""

    name: str
    url: str  # START, or amqp://HOST:PORT[/ADDRESS-PREFIX]
    pid: int | None = None

    @property
    def started(self) -> bool:
        """The bench starts (and stops) this server itself."""
        return self.url == START


def parse_target(name: str, url: str, pid: int | None) -> Target:
    """Check a ``NAME=URL`` pair; ``ValueError`` with a one-line reason."""
    if not name:
        raise ValueError(f"no name in {name}={url}")
    if url != START:
        parts = urlsplit(url)
        if parts.scheme != "amqp" or not parts.hostname:
            raise ValueError(
                f"{name}: expected amqp://HOST[:PORT][/PREFIX] or {START!r}, got {url}"
            )
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError(f"{name}: bad port in {url}")
    return Target(name, url, pid)


@dataclass
class Server:
    """A server reachable for one run."""

    name: str
    host: str
    port: int
    address_prefix: str
    pid: int | None
    metrics_url: str | None = None
    data_dir: Path | None = None
    process: subprocess.Popen[str] | None = None
    log_lines: list[str] = field(default_factory=list)

    def address(self, queue: str) -> str:
        """The AMQP address of a queue on this server (``/queues/NAME`` on sluicegate)."""
        return self.address_prefix + queue

    def url(self, queue: str) -> str:
        """A quiver URL for a queue: its address is the path, the slash rule of the quiver."""
        return f"amqp://{self.host}:{self.port}/{self.address(queue).lstrip('/')}"


def free_port() -> int:
    """A loopback port nothing listens on now (for ``--metrics-listen``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _drain(stream: IO[str], into: list[str]) -> None:
    """Read a server's pipe to its end, then close it: left to the collector, an unclosed pipe
    warns (ResourceWarning) in whatever test happens to be running then."""
    with stream:
        into.extend(line.rstrip("\n") for line in stream)


def start_sluicegate(
    name: str, options: Sequence[str], data_dir: Path, metrics: bool = False
) -> Server:
    """Start ``python -m sluicegate serve`` on a free port (``MissingFeature``, ``ServerError``).

    ``metrics`` puts the Prometheus endpoint on a free port; without it the endpoint is off, so
    that no two servers contend for its default port.
    """
    metrics_port = free_port() if metrics else None
    metrics_listen = "off" if metrics_port is None else f"127.0.0.1:{metrics_port}"
    command = [sys.executable, "-m", "sluicegate", "serve", "--listen", "127.0.0.1:0"]
    command += ["--data-dir", str(data_dir), "--metrics-listen", metrics_listen]
    # No benchmark asks the HTTP API, and its default port would be shared by every server.
    command += ["--http-api-listen", "off", *options]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    errors: list[str] = []
    threading.Thread(target=_drain, args=(process.stderr, errors), daemon=True).start()
    found: list[re.Match[str]] = []

    def wait_for_address() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            match = _ADDRESS_LINE.search(line)
            if match is not None:
                found.append(match)
                return

    reader = threading.Thread(target=wait_for_address, daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT_S)
    if not found:
        process.kill()
        process.wait()
        raise _start_failure(command, process.returncode, errors)
    threading.Thread(target=_drain, args=(process.stdout, []), daemon=True).start()
    match = found[0]
    return Server(
        name=name,
        host=match["host"].strip("[]"),
        port=int(match["port"]),
        address_prefix=DEFAULT_ADDRESS_PREFIX,
        pid=process.pid,
        metrics_url=None if metrics_port is None else f"http://127.0.0.1:{metrics_port}/metrics",
        data_dir=data_dir,
        process=process,
        log_lines=errors,
    )


def _start_failure(
    command: Sequence[str], status: int | None, errors: Sequence[str]
) -> ServerError:
    text = "\n".join(errors)
    unknown = _UNKNOWN_OPTION.search(text)
    if unknown is not None:
        option = unknown["option"]
        feature = FEATURES.get(option, "a feature this scenario needs")
        return MissingFeature(f"this sluicegate has no {option} option: {feature} has not landed")
    last = errors[-1] if errors else f"no address line within {READY_TIMEOUT_S:g} s"
    return ServerError(f"{' '.join(command[2:5])} failed (status {status}): {last}")


def stop(server: Server) -> None:
    """SIGTERM the server we started and wait for its graceful exit (SIGKILL if it hangs)."""
    process = server.process
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def external(target: Target) -> Server:
    """A server given by URL: its host, port and address prefix (``/queues/`` if none)."""
    parts = urlsplit(target.url)
    assert parts.hostname is not None
    return Server(
        name=target.name,
        host=parts.hostname,
        port=parts.port or AMQP_PORT,
        address_prefix=parts.path or DEFAULT_ADDRESS_PREFIX,
        pid=target.pid,
    )


@contextmanager
def running(target: Target, options: Sequence[str] = (), metrics: bool = False) -> Iterator[Server]:
    """The target's server for one run: started fresh (and stopped after) or reached by URL.

    ``options`` are sluicegate flags (``--memory-budget 64MiB``); a server given by URL is
    configured by whoever started it, so they do not apply to it. ``metrics`` asks for the
    Prometheus endpoint of a started sluicegate.
    """
    if not target.started:
        yield external(target)
        return
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-") as scratch:
        server = start_sluicegate(target.name, options, Path(scratch) / "data", metrics)
        try:
            yield server
        finally:
            stop(server)
