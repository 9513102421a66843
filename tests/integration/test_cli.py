"""``sluicegate serve`` and ``python -m sluicegate`` as a user runs them: a real process."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.clients import consume, publish
from support.process import serving
from support.raw_client import RawClient


def _sluicegate() -> list[str]:
    """The console script installed next to this interpreter."""
    script = Path(sys.executable).with_name("sluicegate")
    found = str(script) if script.exists() else shutil.which("sluicegate")
    assert found, "the sluicegate console script is not installed"
    return [found]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "signum"),
    [
        ([*_sluicegate(), "serve"], signal.SIGTERM),
        ([sys.executable, "-m", "sluicegate", "serve"], signal.SIGINT),
    ],
    ids=["sluicegate-serve-sigterm", "python-m-gateway-sigint"],
)
def test_serve_prints_its_address_and_stops_on_a_signal_with_connection_forced(
    command: list[str], signum: signal.Signals, tmp_path: Path
) -> None:
    with serving("--data-dir", str(tmp_path), command=command) as (process, port):
        url = f"amqp://127.0.0.1:{port}"
        assert publish(url, "/queues/cli", ["a", "b"]).outcomes == ["accepted", "accepted"]
        assert consume(url, "/queues/cli", 2).bodies == ["a", "b"]
        with RawClient.connect("127.0.0.1", port) as client:
            process.send_signal(signum)
            close = client.wait_for("close", timeout=10)
            assert close["error"]["condition"] == "amqp:connection:forced"
        assert process.wait(timeout=15) == 0
        assert process.stdout is not None
        assert process.stdout.read() == ""
        # Stopped means no longer listening.
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.0.1", port), timeout=2),
        ):
            pass


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.alone  # binds a default port: docs/testing.md
def test_python_m_gateway_without_arguments_serves_the_default(tmp_path: Path) -> None:
    """``python -m sluicegate`` alone is ``serve`` on 127.0.0.1:5672.

    Where another broker holds 5672 (a benchmark peer, say), it must say so in one line.
    """
    free = _port_is_free(5672)
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        line = process.stdout.readline().rstrip("\n")
        if free:
            assert line == "sluicegate listening on amqp://127.0.0.1:5672"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0
        else:
            assert line == ""
            assert process.wait(timeout=15) != 0
            errors = process.stderr.read().strip().splitlines()
            assert len(errors) == 1
            assert "127.0.0.1:5672" in errors[0]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.slow
def test_a_busy_port_is_one_clear_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*_sluicegate(), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0]
