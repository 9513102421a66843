"""``sluicegate placement move`` (docs/operations.md, issue 35): a data directory of two workers,
with confirmed durable messages on each worker's queue, moved to one worker while the server is
stopped and served again with every message there, in order; refused while a server runs. A
stream moves with every offset kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final, cast

import pytest
from proton import Described, Message, symbol
from proton.reactor import Filter
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.ports import free_port
from support.process import SERVE, serving
from support.workers import blocking_on, children, homed_on, worker_of

from sluicegate.clients.management import ManagementClient

PLACEMENT = (sys.executable, "-m", "sluicegate", "placement", "move")
# Each server here has its own data directory; no metrics endpoint is needed.
QUIET = ("--metrics-listen", "off", "--http-api-listen", "off")
_OFFSET_SPEC: Final = symbol("rabbitmq:stream-offset-spec")
_OFFSET: Final = symbol("x-stream-offset")


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


def _read_stream(url: str, stream: str, start: int | str, count: int) -> list[tuple[int, object]]:
    """``count`` messages of ``stream`` from the offset spec ``start``: each one's offset (its
    ``x-stream-offset``) and body."""
    connection = BlockingConnection(url, timeout=20)
    try:
        offset = Filter({_OFFSET_SPEC: Described(_OFFSET_SPEC, start)})
        receiver = connection.create_receiver(stream, credit=count, options=offset)
        read: list[tuple[int, object]] = []
        for _ in range(count):
            message = receiver.receive(timeout=20)
            annotations = cast(dict[symbol, int], message.annotations)
            read.append((annotations[_OFFSET], message.body))
            receiver.accept()
        return read
    finally:
        connection.close()


@pytest.mark.slow
def test_a_stream_moves_with_every_offset_kept(tmp_path: Path) -> None:
    """A stream of the worker that goes, whose retention dropped its first messages (so its
    first offset is not 0): moved, a reader from ``first`` or from an offset gets the same
    messages at the same offsets, and the next message appended takes the next offset."""
    data_dir = tmp_path / "data"
    stream = homed_on(1, 2, "stream")
    options = ("--data-dir", str(data_dir), *QUIET)
    arguments = {"x-queue-type": "stream", "x-max-length-bytes": 4000}
    with serving("--workers", "2", *options) as (process, port):
        with ManagementClient(f"amqp://127.0.0.1:{port}") as management:
            declared = management.request(
                "PUT", f"/queues/{stream}", {"durable": True, "arguments": arguments}
            )
            assert declared.ok, declared
            pids = sorted(children(process.pid), key=worker_of)
            # Published on worker 0: each message confirmed once worker 1 logged it.
            connection = blocking_on(port, pids, pids[0])
            sender = connection.create_sender(stream)
            for n in range(60):
                sender.send(Message(body=f"s{n}-" + "x" * 100, durable=True))
            connection.close()
            shown = management.request("GET", f"/queues/{stream}")
            assert isinstance(shown.body, dict)
            count = shown.body["message_count"]
            assert isinstance(count, int)
            kept = int(count)
            assert 0 < kept < 60
        url = f"amqp://127.0.0.1:{port}"
        before = _read_stream(url, stream, "first", kept)
        first = before[0][0]
        assert first > 0
        assert before == [(first + n, f"s{first + n}-" + "x" * 100) for n in range(kept)]

    moved = _move(data_dir, 1)
    assert moved.returncode == 0, moved.stderr
    assert f"moved queue '{stream}' (vhost '/') from worker 1 to worker 0: {kept}" in moved.stdout

    with serving("--workers", "1", *options) as (_, port):
        url = f"amqp://127.0.0.1:{port}"
        assert _read_stream(url, stream, "first", kept) == before
        middle = first + kept // 2
        assert _read_stream(url, stream, middle, 3) == before[kept // 2 : kept // 2 + 3]
        connection = BlockingConnection(url, timeout=20)
        try:
            connection.create_sender(stream).send(Message(body="after", durable=True))
        finally:
            connection.close()
        assert _read_stream(url, stream, first + kept, 1) == [(first + kept, "after")]


@pytest.mark.slow
def test_a_stream_emptied_by_its_max_age_moves_with_its_next_offset(tmp_path: Path) -> None:
    """A stream of the worker that goes, whose x-max-age dropped every message: moved, the next
    message appended takes the offset after the last one it had, not 0."""
    data_dir = tmp_path / "data"
    stream = homed_on(1, 2, "aged-stream")
    options = ("--data-dir", str(data_dir), *QUIET)
    arguments = {"x-queue-type": "stream", "x-max-age": "1s"}
    with (
        serving("--workers", "2", *options) as (process, port),
        ManagementClient(f"amqp://127.0.0.1:{port}") as management,
    ):
        declared = management.request(
            "PUT", f"/queues/{stream}", {"durable": True, "arguments": arguments}
        )
        assert declared.ok, declared
        pids = sorted(children(process.pid), key=worker_of)
        connection = blocking_on(port, pids, pids[1])
        sender = connection.create_sender(stream)
        for n in range(10):
            sender.send(Message(body=f"s{n}", durable=True))
        connection.close()

        def emptied() -> bool:
            shown = management.request("GET", f"/queues/{stream}")
            assert isinstance(shown.body, dict)
            return bool(shown.body["message_count"] == 0)

        wait_until(emptied, timeout=30)

    moved = _move(data_dir, 1)
    assert moved.returncode == 0, moved.stderr

    with serving("--workers", "1", *options) as (_, port):
        url = f"amqp://127.0.0.1:{port}"
        connection = BlockingConnection(url, timeout=20)
        try:
            connection.create_sender(stream).send(Message(body="after", durable=True))
        finally:
            connection.close()
        assert _read_stream(url, stream, "first", 1) == [(10, "after")]
