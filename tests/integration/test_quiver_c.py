"""``sluicegate quiver --impl c``: the C arrows, built from the repo, against a real server.

Counts, outcomes and the one-line errors are asserted, never rates or CPU figures beyond their
presence: those depend on the machine. Building needs gcc and Debian's libqpid-proton11-dev
(.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from proton import Message
from proton.utils import BlockingConnection
from support.ports import free_port

from sluicegate.clients.quiver import native

RUN_TIMEOUT_S = 60  # a hung run fails the test instead of eating CI's time


def quiver(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with the C arrows, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.cli.main", "quiver", "--impl", "c", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def results_of(run: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The JSON summary's results of a run that succeeded."""
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["configuration"]["implementation"] == native.IMPLEMENTATION
    results: dict[str, object] = summary["results"]
    return results


@pytest.mark.slow
def test_count_run_settles_every_message(server: RunningServer) -> None:
    results = results_of(quiver(f"{server.url}/queues/quiver-c-count", "--count", "2000", "--json"))
    assert (results["count"], results["sent"], results["accepted"]) == (2000, 2000, 2000)
    latency = results["latency_ms"]
    assert isinstance(latency, dict)
    percentiles = [latency[p] for p in ("p50", "p90", "p99", "p99.9")]
    assert percentiles == sorted(percentiles)
    assert isinstance(results["client_cpu_s"], float)
    assert results["client_cpu_s"] > 0


@pytest.mark.slow
def test_several_senders_and_receivers_split_the_count(server: RunningServer) -> None:
    run = quiver(
        f"{server.url}/queues/quiver-c-many", "--count", "2001", "--senders", "2",
        "--receivers", "2", "--credit", "100", "--json",
    )  # fmt: skip
    results = results_of(run)
    assert (results["count"], results["sent"], results["accepted"]) == (2001, 2001, 2001)
    heading = run.stderr.splitlines()[0]
    assert all(f"{p} CPU/RSS" in heading for p in ("S1", "S2", "R1", "R2"))


@pytest.mark.slow
def test_presettled_durable_run(server: RunningServer) -> None:
    run = quiver(
        f"{server.url}/queues/quiver-c-presettled", "--count", "2000", "--presettled",
        "--durable", "--json",
    )  # fmt: skip
    results = results_of(run)
    assert (results["count"], results["sent"], results["accepted"]) == (2000, 2000, None)


@pytest.mark.slow
def test_duration_run_receives_everything_sent(server: RunningServer) -> None:
    results = results_of(
        quiver(f"{server.url}/queues/quiver-c-duration", "--duration", "1", "--json")
    )
    assert isinstance(results["sent"], int)
    assert results["sent"] > 0
    assert results["count"] == results["sent"] == results["accepted"]


def test_a_foreign_message_fails_the_run_in_one_line(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        connection.create_sender("/queues/quiver-c-foreign").send(Message(body="not a quiver's"))
    finally:
        connection.close()
    run = quiver(f"{server.url}/queues/quiver-c-foreign", "--count", "10")
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1].startswith(
        "sluicegate quiver: receiver 1: /queues/quiver-c-foreign: a "
    )
    assert run.stderr.splitlines()[-1].endswith("message without a 100-byte binary body at its end")


def test_connection_refused_is_one_line() -> None:
    port = free_port()
    run = quiver(f"amqp://127.0.0.1:{port}/q", "--count", "10")
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        f"sluicegate quiver: receiver 1: cannot connect to 127.0.0.1:{port}: Connection refused"
    ]


def test_peer_to_peer_is_refused_as_usage() -> None:
    run = quiver("amqp://127.0.0.1:1/q", "--peer-to-peer")
    assert run.returncode == 2
    assert (
        run.stderr == "sluicegate quiver: --impl c connects to a server: it has no --peer-to-peer\n"
    )


def test_the_build_is_cached_by_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    binary = native.build()
    assert binary.is_relative_to(tmp_path / "sluicegate" / "quiver-c")
    built_ns = binary.stat().st_mtime_ns
    assert native.build() == binary
    assert binary.stat().st_mtime_ns == built_ns
    assert os.access(binary, os.X_OK)
    assert [p.name for p in binary.parent.iterdir()] == ["arrow"]


def test_a_missing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(native.NativeBuildError, match="needs gcc and libqpid-proton11-dev"):
        native.build()
