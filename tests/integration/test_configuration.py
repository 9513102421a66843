"""``sluicegate serve`` as a subprocess: a bad setting stops it with one line naming the key."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ports import free_port

# Generous: the machine running the tests may be loaded.
START_TIMEOUT = 60


def serve(
    *args: str, environ: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``sluicegate serve`` expecting it to stop on its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    env.update(environ or {})
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.cli.main", "serve", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=START_TIMEOUT,
        check=False,
    )


@pytest.fixture
def bound_port() -> Iterator[int]:
    """A loopback port that is already in use."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("toml", "sluicegate: max_frame_size: expected a size such as 65536 or 64MiB, got 'huge'"),
        ("env", "sluicegate: max_link_credit: must be positive, got -3"),
        ("flag", "sluicegate: metrics_listen: expected HOST:PORT, got 'nowhere'"),
        ("unknown", "sluicegate: colour: unknown key in "),
    ],
)
def test_an_invalid_value_stops_the_server_with_one_line(
    tmp_path: Path, source: str, expected: str
) -> None:
    config = tmp_path / "sluicegate.toml"
    config.write_text('listen = "127.0.0.1:0"\nmetrics_listen = "off"\n')
    args = ["--config", str(config)]
    environ: dict[str, str] = {}
    if source == "toml":
        config.write_text(config.read_text() + 'max_frame_size = "huge"\n')
    elif source == "env":
        environ["SLUICEGATE_MAX_LINK_CREDIT"] = "-3"
    elif source == "flag":
        args += ["--metrics-listen", "nowhere"]
    else:
        config.write_text(config.read_text() + 'colour = "blue"\n')
    result = serve(*args, environ=environ)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected)


@pytest.mark.alone  # binds a default port: docs/testing.md
@pytest.mark.slow
@pytest.mark.parametrize("key", ["listen", "metrics_listen"])
def test_an_address_in_use_stops_the_server_with_one_line(bound_port: int, key: str) -> None:
    taken = f"127.0.0.1:{bound_port}"
    addresses = {"listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0", key: taken}
    result = serve("--listen", addresses["listen"], "--metrics-listen", addresses["metrics_listen"])
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"sluicegate: {key}: cannot listen on {taken}: Address already in use"
    ]


@pytest.mark.alone  # binds a default port: docs/testing.md
def test_settings_from_file_and_flags(tmp_path: Path) -> None:
    """The flag's listen address wins over the file's; the file's metrics address is used."""
    metrics_port = free_port()
    config = tmp_path / "sluicegate.toml"
    config.write_text(f'listen = "127.0.0.1:1"\nmetrics_listen = "127.0.0.1:{metrics_port}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    command = [sys.executable, "-m", "sluicegate.cli.main", "serve", "--config", str(config)]
    with subprocess.Popen(
        [*command, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as child:
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.startswith("sluicegate listening on amqp://127.0.0.1:")
            assert not line.strip().endswith(":1")
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=START_TIMEOUT) as response:
                assert "sluicegate_connections 0.0" in response.read().decode()
        finally:
            child.terminate()
            assert child.wait(timeout=START_TIMEOUT) == 0
