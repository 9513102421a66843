"""``sluicegate serve --workers N`` as a user runs it: one port over N worker processes, each
with its own log; a killed worker comes back with its confirmed messages while the others serve
on; SIGTERM stops them all (issue 35, stage 2)."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.utils import BlockingConnection
from support.certificates import self_signed
from support.polling import wait_until
from support.ports import free_port
from support.process import SERVE, serving, tls_port
from support.workers import (
    blocking_on,
    children,
    client_ports,
    connect,
    homed_on,
    socket_inodes,
    tcp_entries,
    worker_of,
)

from sluicegate.clients.management import ManagementClient
from sluicegate.gateway.queue_homes_file import PLACEMENT_FILE
from sluicegate.queues.queue_homes import Homes, proposed_home

_WORKERS_OFF = ("--metrics-listen", "off", "--http-api-listen", "off")


def _connect(port: int, workers: list[int]) -> tuple[BlockingConnection, int]:
    """A connection to the server and the worker process that accepted it."""
    return connect(
        port, workers, lambda: BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=20)
    )


@pytest.mark.slow
def test_workers_share_one_port_and_each_keeps_its_own_log(tmp_path: Path) -> None:
    with serving("--workers", "2", "--data-dir", str(tmp_path), *_WORKERS_OFF) as (process, port):
        workers = children(process.pid)
        assert len(workers) == 2
        assert sorted(path.name for path in tmp_path.iterdir()) == ["worker-0", "worker-1"]
        connections = [_connect(port, workers) for _ in range(16)]
        try:
            # Both accept: 16 connections all on one worker would happen 1 time in 32,768.
            assert {owner for _, owner in connections} == set(workers)
            # Each connection is a whole server's: it sends to and receives from its queue.
            connection, _ = connections[0]
            connection.create_sender("echo").send(Message(body="hello"))
            receiver = connection.create_receiver("echo")
            message = receiver.receive(timeout=10)
            receiver.accept()
            assert message.body == "hello"
        finally:
            for connection, _ in connections:
                connection.close()


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _resident(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.slow
def test_one_scrape_adds_up_every_worker(tmp_path: Path) -> None:
    metrics = free_port()
    with serving(
        "--workers",
        "2",
        "--data-dir",
        str(tmp_path),
        "--metrics-listen",
        f"127.0.0.1:{metrics}",
        "--http-api-listen",
        "off",
        "--memory-budget",
        "64MiB",
    ) as (process, port):
        first, second = children(process.pid)
        on_first = blocking_on(port, [first, second], first)
        on_second = blocking_on(port, [first, second], second)
        try:
            for connection, count in ((on_first, 3), (on_second, 5)):
                sender = connection.create_sender("counted")
                for n in range(count):
                    sender.send(Message(body=f"m{n}"))
            samples = _scrape(metrics)
            queue = (("queue", "counted"), ("vhost", "/"))
            assert samples[("sluicegate_queue_messages_ready", queue)] == 8
            assert samples[("sluicegate_connections", ())] == 2
            assert samples[("sluicegate_workers", ())] == 2
            assert samples[("sluicegate_workers_scraped", ())] == 2
            # Each worker has half the budget: the server's is the one configured.
            assert samples[("sluicegate_memory_budget_limit_bytes", ())] == 64 * 2**20
            # The server's resident memory is both workers' (each at least 20 MiB of Python).
            both = _resident(first) + _resident(second)
            assert samples[("process_resident_memory_bytes", ())] >= 0.8 * both
        finally:
            on_first.close()
            on_second.close()


@pytest.mark.alone  # bounds a latency: docs/testing.md
@pytest.mark.slow
def test_a_killed_worker_comes_back_with_its_confirmed_messages_while_the_other_serves_on(
    tmp_path: Path,
) -> None:
    with serving("--workers", "2", "--data-dir", str(tmp_path), *_WORKERS_OFF) as (process, port):
        first, second = children(process.pid)
        doomed = blocking_on(port, [first, second], first)
        survivor = blocking_on(port, [first, second], second)
        # The killed worker's queue, and one the survivor owns.
        kept, other = homed_on(worker_of(first), 2), homed_on(worker_of(second), 2)
        sender = doomed.create_sender(kept)
        for n in range(20):
            # A blocking send returns once the server settled it: stored and fsynced.
            sender.send(Message(body=f"kept-{n}", durable=True))
        survivor_sender = survivor.create_sender(other)
        survivor_receiver = survivor.create_receiver(other)
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        # The other worker serves on meanwhile: its connection is untouched.
        survivor_sender.send(Message(body="during"))
        assert survivor_receiver.receive(timeout=10).body == "during"
        survivor_receiver.accept()
        restarted: list[int] = []

        def back() -> bool:
            restarted[:] = [pid for pid in children(process.pid) if pid not in (first, second)]
            return bool(restarted)

        wait_until(back, timeout=30)
        (again,) = restarted
        fresh = blocking_on(port, [again, second], again)
        recovered = time.monotonic() - killed_at
        receiver = fresh.create_receiver(kept)
        bodies = []
        for _ in range(20):
            bodies.append(receiver.receive(timeout=10).body)
            receiver.accept()
        assert bodies == [f"kept-{n}" for n in range(20)]
        # Generous: the restart is a fork and a log replay of 20 messages.
        assert recovered < 30
        for connection in (fresh, survivor):
            connection.close()
        process.terminate()
        assert process.wait(timeout=20) == 0
        assert process.stderr is not None
        log = process.stderr.read()
        assert re.search(r"worker 0 \(pid \d+\) ended: killed by SIGKILL; starting it again", log)
        assert re.search(r"worker 0 serves again \(pid \d+\), recovered in [0-9.]+ s", log)


@pytest.mark.slow  # waits out the 2 s shutdown_timeout of 3 workers
@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_sigterm_stops_every_worker_within_the_grace(tmp_path: Path) -> None:
    with serving(
        "--workers", "3", "--data-dir", str(tmp_path), "--shutdown-timeout", "2", *_WORKERS_OFF
    ) as (process, port):
        workers = children(process.pid)
        assert len(workers) == 3
        connection, _ = _connect(port, workers)
        started = time.monotonic()
        process.terminate()
        assert process.wait(timeout=20) == 0
        # shutdown_timeout, the workers' watchdog margin and the supervisor's, with room.
        assert time.monotonic() - started < 2 + 1 + 2 + 5
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
        connection.close()


@pytest.mark.slow
def test_every_worker_takes_tls_clients_on_the_one_amqps_port(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "localhost", "DNS:localhost,IP:127.0.0.1")
    env = {**os.environ, "SLUICEGATE_TLS_CERT_FILE": str(cert), "SLUICEGATE_TLS_KEY_FILE": str(key)}
    options = ("--tls-listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"))
    with serving("--workers", "2", *options, *_WORKERS_OFF, env=env) as (process, _):
        port = tls_port(process)
        workers = children(process.pid)
        context = ssl.create_default_context(cafile=str(cert))
        owners: set[int] = set()
        for _ in range(16):
            before = client_ports(port)
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                context.wrap_socket(raw, server_hostname="localhost") as tls,
            ):
                assert tls.version() is not None
                (mine,) = client_ports(port) - before
                ours = (port, mine)
                inodes = {i for local, remote, i in tcp_entries() if (local, remote) == ours}
                owners.update(pid for pid in workers if inodes & socket_inodes(pid))
        # 16 handshakes all with one worker would happen 1 time in 32,768.
        assert owners == set(workers)


@pytest.mark.slow
def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    with serving("--workers", "2", "--data-dir", str(tmp_path), *_WORKERS_OFF) as (process, _):
        workers = children(process.pid)
        process.kill()
        process.wait(timeout=10)
        # Each was told by the kernel (PR_SET_PDEATHSIG) and shut down: nobody serves the port
        # unsupervised.
        wait_until(lambda: not [pid for pid in workers if _alive(pid)], timeout=30)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent's wait does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_queues_leader_names_the_worker_it_lives_on_whoever_asks(tmp_path: Path) -> None:
    # One queue placed on each worker, declared through whichever worker the client reached.
    names = {home: homed_on(home, 2) for home in (0, 1)}
    with serving("--workers", "2", "--data-dir", str(tmp_path), *_WORKERS_OFF) as (process, port):
        workers = children(process.pid)
        found: dict[int, dict[int, str]] = {}
        for _ in range(200):
            before = client_ports(port)
            with ManagementClient(f"amqp://127.0.0.1:{port}") as client:
                (mine,) = client_ports(port) - before
                ours = (port, mine)
                inodes = {i for local, remote, i in tcp_entries() if (local, remote) == ours}
                (owner,) = [pid for pid in workers if inodes & socket_inodes(pid)]
                index = worker_of(owner)
                if index in found:
                    continue
                found[index] = {}
                for home, name in names.items():
                    declared = client.request("PUT", f"/queues/{name}", {"durable": True})
                    assert declared.status in (200, 201)
                    reply = client.request("GET", f"/queues/{name}")
                    assert isinstance(reply.body, dict)
                    found[index][home] = str(reply.body["leader"])
            if len(found) == len(workers):
                break
        assert sorted(found) == [0, 1]
        for leaders in found.values():
            for home, leader in leaders.items():
                assert leader.startswith(f"rabbit-worker-{home}@")


def _serve_once(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, "--listen", "127.0.0.1:0", *_WORKERS_OFF, *options],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.slow  # starts a server four times
def test_a_data_dir_is_served_only_with_the_layout_it_was_written_in(tmp_path: Path) -> None:
    single = tmp_path / "single"
    with serving("--data-dir", str(single), *_WORKERS_OFF):
        pass
    refused = _serve_once("--workers", "2", "--data-dir", str(single))
    assert refused.returncode == 1
    assert "holds the log of a single server" in refused.stderr
    spread = tmp_path / "spread"
    with serving("--workers", "2", "--data-dir", str(spread), *_WORKERS_OFF):
        pass
    refused = _serve_once("--data-dir", str(spread))
    assert refused.returncode == 1
    assert "holds the logs of 2 workers (worker-0, worker-1)" in refused.stderr


@pytest.mark.slow
def test_fewer_workers_than_the_placement_needs_are_refused_naming_the_stranded_queues(
    tmp_path: Path,
) -> None:
    # Placed as a server of three workers records them (gateway/queue_homes_file.py).
    homes = Homes(3)
    kept, stranded = homed_on(0, 3, "kept"), homed_on(2, 3, "stranded")
    records = [homes.place("/", kept)[1], homes.place("/", stranded)[1]]
    (tmp_path / PLACEMENT_FILE).write_text("".join(str(record) for record in records))
    for index in range(3):
        (tmp_path / f"worker-{index}").mkdir()
    refused = _serve_once("--workers", "2", "--data-dir", str(tmp_path))
    assert refused.returncode == 1
    assert f"'{stranded}' (vhost '/', worker 2)" in refused.stderr
    assert kept not in refused.stderr
    assert "at least 3 workers" in refused.stderr
    # The step it names moves the stranded queue (not durable: only its record) to a worker
    # of the two, and the two then serve.
    assert "sluicegate placement move --to-workers 2" in refused.stderr
    moved = subprocess.run(
        [sys.executable, "-m", "sluicegate", "placement", "move", "--to-workers=2", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert moved.returncode == 0, moved.stderr
    home = proposed_home("/", stranded, 2)
    assert f"'{stranded}' (vhost '/') from worker 2 to worker {home}: 0 durable" in moved.stdout
    assert Homes.replay((tmp_path / PLACEMENT_FILE).read_text(), 2).stranded() == []
    with serving("--workers", "2", "--data-dir", str(tmp_path), *_WORKERS_OFF):
        pass


@pytest.mark.slow
def test_a_worker_that_cannot_start_stops_the_server_with_its_reason(tmp_path: Path) -> None:
    # worker-1 cannot be a directory: its server cannot open its log.
    (tmp_path / "worker-1").write_text("not a directory")
    process = subprocess.Popen(
        [*SERVE, "--listen", "127.0.0.1:0", *_WORKERS_OFF, "--workers=2", f"--data-dir={tmp_path}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "listening" not in out
    assert "cannot open the data directory" in err
    assert "worker 1 did not start" in err
    # Worker 0 was stopped with it: no process serves that data directory any more.
    assert _serving_dir(tmp_path) == []


def _serving_dir(data_dir: Path) -> list[int]:
    """Processes whose command line names ``data_dir`` (forked workers keep the supervisor's)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"--data-dir={data_dir}".encode() in command:
            found.append(int(proc.name))
    return found


@pytest.mark.slow
def test_a_number_of_workers_out_of_range_is_refused_naming_the_setting() -> None:
    for value in ("0", "257"):
        refused = _serve_once("--workers", value)
        assert refused.returncode == 2
        assert f"workers: must be 1 to 256, got {value}" in refused.stderr


def test_the_help_names_the_workers_flag() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--workers WORKERS" in shown.stdout
