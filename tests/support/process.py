"""A sluicegate server in its own process, started as a user starts it.

For what an in-process server cannot show: signals, exit status, a crash, the process's memory.
"""

from __future__ import annotations

import contextlib
import re
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

import pytest

LISTENING: Final = re.compile(r"^sluicegate listening on amqp://127\.0\.0\.1:(\d+)$")
TLS_LISTENING: Final = re.compile(r"^sluicegate listening on amqps://127\.0\.0\.1:(\d+)$")
SERVE: Final = (sys.executable, "-m", "sluicegate", "serve")


def tls_port(process: subprocess.Popen[str]) -> int:
    """The amqps:// port of a server started with ``--tls-listen 127.0.0.1:0`` and a certificate
    (the line it prints after the amqp:// one)."""
    assert process.stdout is not None
    line = process.stdout.readline().rstrip("\n")
    match = TLS_LISTENING.match(line)
    assert match is not None, f"second line {line!r}"
    return int(match.group(1))


def _descriptor_limit(soft: int) -> Callable[[], None]:
    """Lower RLIMIT_NOFILE in the child before it starts the server."""

    def lower() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return lower


@contextmanager
def serving(
    *options: str,
    command: Sequence[str] = SERVE,
    env: Mapping[str, str] | None = None,
    descriptors: int | None = None,
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Run ``command --listen 127.0.0.1:0 OPTIONS`` until the block ends: the process, its port.

    The port is read from the line the server prints when ready; anything else fails the test
    with the server's stderr. At the end a server still running gets SIGTERM, then SIGKILL.
    ``descriptors`` lowers the server's descriptor limit (RLIMIT_NOFILE) to that many. Unless
    the options or ``env`` name a data directory, the server gets a new empty one: its
    default, ``sluicegate-data`` in the working directory, would carry durable queues from one
    test to the next.
    """
    with contextlib.ExitStack() as scratch:
        if "--data-dir" not in options and "SLUICEGATE_DATA_DIR" not in (env or {}):
            data_dir = scratch.enter_context(tempfile.TemporaryDirectory(prefix="sluicegate-"))
            options = ("--data-dir", data_dir, *options)
        if "--http-api-listen" not in options and "SLUICEGATE_HTTP_API_LISTEN" not in (env or {}):
            # RabbitMQ's port may be taken (by RabbitMQ, by another test's server).
            options = ("--http-api-listen", "127.0.0.1:0", *options)
        yield from _serving(options, command, env, descriptors)


def _serving(
    options: Sequence[str],
    command: Sequence[str],
    env: Mapping[str, str] | None,
    descriptors: int | None,
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    process = subprocess.Popen(
        [*command, "--listen", "127.0.0.1:0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        preexec_fn=None if descriptors is None else _descriptor_limit(descriptors),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().rstrip("\n")
        match = LISTENING.match(line)
        if match is None:
            assert process.stderr is not None
            process.kill()
            pytest.fail(f"first line {line!r}, stderr {process.stderr.read()!r}")
        yield process, int(match.group(1))
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
