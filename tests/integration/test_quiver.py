"""``sluicegate quiver`` end to end: the real CLI, its processes, a real server, parsed output.

Counts and the shape of the output are asserted, never rates: those depend on the machine.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from proton import Endpoint, Event, Handler
from proton.reactor import ApplicationEvent, Container, EventInjector
from support.ports import free_port

RUN_TIMEOUT_S = 60  # a hung run fails the test instead of eating CI's time
FIELD = re.compile(r"^(?P<name>.*?) \.+ (?P<value>.+)$")  # quiver's "Name ..... value unit"


def quiver(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.cli.main", "quiver", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def block(output: str, heading: str) -> dict[str, str]:
    """The fields of one summary block (CONFIGURATION or RESULTS): name → value and unit."""
    lines = output.splitlines()
    start = lines.index(heading) + 2
    fields: dict[str, str] = {}
    for line in lines[start:]:
        if line.isupper():
            break
        match = FIELD.match(line)
        if match:
            fields[match["name"]] = match["value"]
    return fields


def number(text: str) -> float:
    """The figure that opens a field: ``"2,000 messages"`` → 2000."""
    return float(text.split()[0].replace(",", ""))


@pytest.mark.slow
def test_count_run_prints_both_blocks(server: RunningServer) -> None:
    run = quiver(f"{server.url}/queues/quiver-count", "--count", "2000", "--credit", "100")
    assert run.returncode == 0, run.stderr
    configuration = block(run.stdout, "CONFIGURATION")
    assert configuration["Address"] == "/queues/quiver-count"
    assert configuration["Count"] == "2,000 messages"
    assert configuration["Credit window"] == "100 messages"
    results = block(run.stdout, "RESULTS")
    assert results["Count"] == "2,000 messages"
    assert number(results["Duration"]) > 0
    for rate in ("Sender rate", "Receiver rate", "End-to-end rate"):
        assert number(results[rate]) > 0
    latencies = [number(results[f"Latency {name}"]) for name in ("p50", "p90", "p99", "p99.9")]
    assert latencies == sorted(latencies)
    assert run.stdout.splitlines()[0].split()[:2] == ["Time", "[s]"]
    assert run.stderr == ""


@pytest.mark.slow
def test_json_summary_to_a_file(server: RunningServer, tmp_path: Path) -> None:
    output = tmp_path / "run"
    run = quiver(
        f"{server.url}/queues/quiver-json", "--count", "2000", "--json", "--output", str(output)
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads((output / "summary.json").read_text())
    assert summary["configuration"]["address"] == "/queues/quiver-json"
    results = summary["results"]
    assert (results["count"], results["sent"], results["accepted"]) == (2000, 2000, 2000)
    assert set(results["latency_ms"]) == {"average", "p50", "p90", "p99", "p99.9"}
    assert block((output / "summary.txt").read_text(), "RESULTS")["Count"] == "2,000 messages"
    assert block(run.stdout, "RESULTS")["Count"] == "2,000 messages"


@pytest.mark.slow
def test_json_summary_alone_on_stdout(server: RunningServer) -> None:
    run = quiver(f"{server.url}/queues/quiver-stdout", "--count", "2000", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["results"]["count"] == 2000
    assert block(run.stderr, "RESULTS")["Count"] == "2,000 messages"


@pytest.mark.slow
def test_several_senders_and_receivers_split_the_count(server: RunningServer) -> None:
    run = quiver(
        f"{server.url}/queues/quiver-many",
        "--count",
        "2001",
        "--senders",
        "2",
        "--receivers",
        "2",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)["results"]
    assert (results["count"], results["sent"], results["accepted"]) == (2001, 2001, 2001)
    heading = run.stderr.splitlines()[0]
    assert all(f"{p} CPU/RSS" in heading for p in ("S1", "S2", "R1", "R2"))


@pytest.mark.slow
def test_presettled_durable_run(server: RunningServer) -> None:
    run = quiver(
        f"{server.url}/queues/quiver-presettled", "--count", "2000", "--presettled", "--durable",
        "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["results"]["count"] == 2000
    assert summary["results"]["accepted"] is None
    assert block(run.stderr, "CONFIGURATION")["Flags"] == "durable, presettled"


@pytest.mark.slow
def test_duration_run_receives_everything_sent(server: RunningServer) -> None:
    run = quiver(f"{server.url}/queues/quiver-duration", "--duration", "1", "--json")
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)["results"]
    assert results["sent"] > 0
    assert results["count"] == results["sent"] == results["accepted"]


@pytest.mark.slow
def test_peer_to_peer() -> None:
    run = quiver(f"amqp://127.0.0.1:{free_port()}/p2p", "--count", "2000", "--peer-to-peer")
    assert run.returncode == 0, run.stderr
    assert block(run.stdout, "RESULTS")["Count"] == "2,000 messages"
    assert block(run.stdout, "CONFIGURATION")["Flags"] == "peer-to-peer"


@pytest.mark.parametrize("url", ["http://127.0.0.1/q", "amqp://127.0.0.1:5672", "q1"])
@pytest.mark.slow
def test_bad_url_is_one_line(url: str) -> None:
    run = quiver(url)
    assert run.returncode == 2
    assert run.stdout == ""
    assert len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("sluicegate quiver: ")


@pytest.mark.slow
def test_connection_refused_is_one_line() -> None:
    port = free_port()
    run = quiver(f"amqp://127.0.0.1:{port}/q", "--count", "10")
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        f"sluicegate quiver: receiver 1: cannot connect to 127.0.0.1:{port}: Connection refused"
    ]


@pytest.mark.slow
def test_a_silent_peer_times_out_in_one_line() -> None:
    with socket.socket() as silent:  # accepts TCP connections (backlog) but never speaks AMQP
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        run = quiver(f"amqp://127.0.0.1:{port}/q", "--count", "10", "--timeout", "1")
    assert run.returncode == 1
    assert len(run.stderr.splitlines()) == 1
    assert "timed out after 1 s" in run.stderr


class Withholder(Handler):
    """An AMQP peer that attaches every link and never grants credit: a server that is stuck."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.ready = threading.Event()
        self.injector = EventInjector()
        self.container = Container(self)
        self.container.selectable(self.injector)

    def on_reactor_init(self, event: Event) -> None:
        self.acceptor = self.container.listen(f"127.0.0.1:{self.port}")
        self.ready.set()

    def on_connection_remote_open(self, event: Event) -> None:
        assert event.connection is not None
        event.connection.open()

    def on_session_remote_open(self, event: Event) -> None:
        assert event.session is not None
        event.session.open()

    def on_link_remote_open(self, event: Event) -> None:
        link = event.link
        assert link is not None
        if link.state & Endpoint.LOCAL_UNINIT:
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.open()

    def on_withholder_stop(self, event: Event) -> None:
        self.acceptor.close()
        self.injector.close()
        self.container.stop()


@pytest.fixture
def withholder() -> Iterator[Withholder]:
    """A ``Withholder`` on a background thread, stopped after the test."""
    peer = Withholder(free_port())
    thread = threading.Thread(target=peer.container.run, daemon=True)
    thread.start()
    assert peer.ready.wait(5.0)
    yield peer
    peer.injector.trigger(ApplicationEvent("withholder_stop"))
    thread.join(5.0)
    assert not thread.is_alive()


@pytest.mark.slow
def test_no_progress_after_attaching_is_one_line(withholder: Withholder) -> None:
    run = quiver(f"amqp://127.0.0.1:{withholder.port}/q", "--count", "10", "--timeout", "1")
    assert run.returncode == 1
    [line] = run.stderr.splitlines()
    assert line.startswith("sluicegate quiver: no progress for ")
    assert line.endswith("(timeout 1 s): 0 sent, 0 received")
