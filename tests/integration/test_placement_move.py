"""``sluicegate placement move`` (docs/operations.md, issue 35): a data directory of two workers,
with confirmed durable messages on each worker's queue, moved to one worker while the server is
stopped and served again with every message there, in order; refused while a server runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection
from support.ports import free_port
from support.process import SERVE, serving
from support.workers import blocking_on, children, homed_on, worker_of

from sluicegate.clients.management import ManagementClient

PLACEMENT = (sys.executable, "-m", "sluicegate", "placement", "move")
# Each server here has its own data directory; no metrics endpoint is needed.
QUIET = ("--metrics-listen", "off", "--http-api-listen", "off")


def _move(data_dir: Path, workers: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PLACEMENT, "--to-workers", str(workers), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _bodies(connection_url: str, queue: str, count: int) -> list[object]:
    """The first ``count`` messages' bodies, each accepted."""
    connection = BlockingConnection(connection_url, timeout=20)
    try:
        receiver = connection.create_receiver(queue, credit=count)
        bodies: list[object] = []
        for _ in range(count):
            message = receiver.receive(timeout=20)
            bodies.append(message.body)
            receiver.accept()
        return bodies
    finally:
        connection.close()


@pytest.mark.slow
def test_queues_of_a_worker_that_is_gone_move_with_every_confirmed_message(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    queues = {home: homed_on(home, 2, "moving") for home in (0, 1)}
    options = ("--data-dir", str(data_dir), *QUIET)
    with serving("--workers", "2", *options) as (process, port):
        with ManagementClient(f"amqp://127.0.0.1:{port}") as management:
            for queue in queues.values():
                assert management.request("PUT", f"/queues/{queue}", {"durable": True}).ok
        pids = sorted(children(process.pid), key=worker_of)
        # Published on worker 0 to both: each message confirmed (settled) once its owner
        # logged it.
        connection = blocking_on(port, pids, pids[0])
        for home, queue in queues.items():
            sender = connection.create_sender(queue)
            for n in range(20):
                sender.send(Message(body=f"{home}-{n}", durable=True))
        connection.close()
        # A running server keeps its directories: the move is refused, nothing changed.
        running = _move(data_dir, 1)
        assert running.returncode == 2
        assert "stop the server first" in running.stderr
        assert (data_dir / "worker-1").is_dir()

    # One worker cannot serve the two workers' logs.
    refused = subprocess.run(
        [*SERVE, "--workers", "1", "--listen", f"127.0.0.1:{free_port()}", *options],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0
    assert "worker-0, worker-1" in refused.stderr

    moved = _move(data_dir, 1)
    assert moved.returncode == 0, moved.stderr
    assert f"moved queue '{queues[1]}' (vhost '/') from worker 1 to worker 0: 20" in moved.stdout
    assert (data_dir / "retired-worker-1").is_dir()
    # Done once: a second run finds nothing left to move.
    again = _move(data_dir, 1)
    assert again.returncode == 2
    assert "single server's log" in again.stderr

    with serving("--workers", "1", *options) as (_, port):
        url = f"amqp://127.0.0.1:{port}"
        for home, queue in queues.items():
            assert _bodies(url, queue, 20) == [f"{home}-{n}" for n in range(20)]
