"""Filters, stream offsets and virtual hosts made at run time across workers (issue 35,
docs/workers.md): a consumer on the worker that does not own its queue gets what a local
consumer gets, and a virtual host the HTTP API makes on worker 0 can be entered, with its
creator's grant, on worker 1. One server of two workers, with users, serves the module: each
test uses queues and virtual hosts of its own."""

from __future__ import annotations

import base64
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast
from urllib.parse import quote

import pytest
from proton import ConnectionException, Described, Message, Timeout, symbol, ulong
from proton.reactor import Filter, Selector
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached
from support.polling import wait_until
from support.ports import free_port
from support.process import serving
from support.workers import children, connection_on, worker_of

from sluicegate.gateway.rules.auth import hash_password
from sluicegate.gateway.runtime_vhosts import FILE_NAME
from sluicegate.queues.queue_homes import proposed_home

PASSWORD: Final = "s3cret"
_OFFSET_SPEC: Final = symbol("rabbitmq:stream-offset-spec")
_STREAM_FILTER: Final = symbol("rabbitmq:stream-filter")


@dataclass(frozen=True)
class Workers:
    """A server of two workers: its AMQP port, worker pids by index, the HTTP API's port (on
    worker 0) and its data directory."""

    port: int
    pids: list[int]
    http_port: int
    data_dir: Path
    supervisor: int

    def connection(self, worker: int, user: str = "root", vhost: str = "/") -> BlockingConnection:
        def opened() -> BlockingConnection:
            return BlockingConnection(
                f"amqp://127.0.0.1:{self.port}",
                timeout=20,
                user=user,
                password=PASSWORD,
                allowed_mechs="PLAIN",
                virtual_host=f"vhost:{vhost}",
            )

        return connection_on(
            self.port, self.pids, self.pids[worker], opened, BlockingConnection.close
        )

    def api(self, method: str, path: str, body: object = None) -> int:
        """The HTTP API's status for a request as root."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/api{path}", data=data, method=method
        )
        request.add_header("Authorization", "Basic " + _basic("root"))
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=20) as response:
            status: int = response.status
            return status


def _basic(user: str) -> str:
    return base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    http = free_port()
    root = tmp_path_factory.mktemp("filters")
    data_dir = root / "data"
    hashed = hash_password(PASSWORD)
    config = root / "sluicegate.toml"
    config.write_text(
        "".join(
            f'[users.{user}]\npassword_hash = "{hashed}"\ntags = ["administrator"]\n'
            for user in ("root", "ops")
        )
    )
    options = (
        "--config",
        str(config),
        "--workers",
        "2",
        "--worker-handover",
        "false",
        "--data-dir",
        str(data_dir),
    )
    listens = ("--metrics-listen", "off", "--http-api-listen", f"127.0.0.1:{http}")
    with serving(*options, *listens) as (process, port):
        pids = sorted(children(process.pid), key=worker_of)
        yield Workers(port, pids, http, data_dir, process.pid)


def _homed(vhost: str, home: int, prefix: str) -> str:
    """A queue name of ``vhost`` the placement hash puts on worker ``home``."""
    return next(
        name
        for name in (f"{prefix}-{n}" for n in range(1000))
        if proposed_home(vhost, name, 2) == home
    )


def _declare(workers: Workers, vhost: str, queue: str, arguments: dict[str, object]) -> None:
    path = f"/queues/{quote(vhost, safe='')}/{queue}"
    assert workers.api("PUT", path, {"durable": True, "arguments": arguments}) == 201


def _publish(workers: Workers, worker: int, queue: str, messages: list[Message]) -> None:
    connection = workers.connection(worker)
    try:
        sender = connection.create_sender(queue)
        for message in messages:
            sender.send(message)
    finally:
        connection.close()


def _take(receiver: BlockingReceiver, count: int) -> list[Message]:
    """The next ``count`` messages the receiver gets, accepted."""
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=20))
        receiver.accept()
    return got


def _nothing_more(receiver: BlockingReceiver) -> bool:
    try:
        receiver.receive(timeout=0.5)
    except Timeout:
        return True
    return False


def test_a_filtered_consumer_of_another_workers_queue_gets_what_a_local_one_would(
    workers: Workers,
) -> None:
    queue = _homed("/", 1, "filtered")
    _declare(workers, "/", queue, {})
    regions = ["eu", "us", "eu", "apac", "us", "eu"]
    _publish(
        workers,
        1,
        queue,
        [Message(body=f"m{n}", properties={"region": r}) for n, r in enumerate(regions)],
    )
    consumer = workers.connection(0)
    try:
        eu = consumer.create_receiver(
            queue, credit=10, name="eu", options=Selector("region = 'eu'")
        )
        assert [m.body for m in _take(eu, 3)] == ["m0", "m2", "m5"]
        us = Filter({symbol("us"): Described(ulong(0x174), {"region": "us"})})
        assert [
            m.body
            for m in _take(consumer.create_receiver(queue, credit=10, name="us", options=us), 2)
        ] == [
            "m1",
            "m4",
        ]
        # What no filter took is still there, for a consumer without one.
        rest = consumer.create_receiver(queue, credit=10, name="rest")
        assert [m.body for m in _take(rest, 1)] == ["m3"]
        assert _nothing_more(rest)
    finally:
        consumer.close()


def test_an_invalid_filter_is_refused_on_either_worker_with_the_same_condition(
    workers: Workers,
) -> None:
    queue = _homed("/", 1, "refused")
    _declare(workers, "/", queue, {})
    conditions = []
    for worker in (0, 1):
        connection = workers.connection(worker)
        try:
            with pytest.raises(LinkDetached) as refused:
                connection.create_receiver(
                    queue, name="refused", options=Selector("region = = 'eu'")
                )
            conditions.append(refused.value.condition)
            # The connection carries on.
            connection.create_receiver(queue, credit=1, name="after")
        finally:
            connection.close()
    assert conditions == ["amqp:invalid-field", "amqp:invalid-field"]


def test_a_stream_reader_on_another_worker_starts_at_its_offset_and_filters_values(
    workers: Workers,
) -> None:
    stream = _homed("/", 1, "offsets")
    _declare(workers, "/", stream, {"x-queue-type": "stream"})
    tags = ["a", "b", "a", "b", "a"]
    _publish(
        workers,
        0,
        stream,
        [
            Message(body=f"s{n}", annotations={symbol("x-stream-filter-value"): tag})
            for n, tag in enumerate(tags)
        ],
    )
    consumer = workers.connection(0)
    try:
        offset = Filter({_OFFSET_SPEC: Described(_OFFSET_SPEC, 2)})
        got = _take(consumer.create_receiver(stream, credit=10, name="offset", options=offset), 3)
        assert [m.body for m in got] == ["s2", "s3", "s4"]
        offsets = [cast(dict[symbol, int], m.annotations)[symbol("x-stream-offset")] for m in got]
        assert offsets == [2, 3, 4]
        values = Filter(
            {
                _OFFSET_SPEC: Described(_OFFSET_SPEC, "first"),
                _STREAM_FILTER: Described(_STREAM_FILTER, "b"),
            }
        )
        reader = consumer.create_receiver(stream, credit=10, name="values", options=values)
        assert [m.body for m in _take(reader, 2)] == ["s1", "s3"]
        assert _nothing_more(reader)
    finally:
        consumer.close()


def _kept(workers: Workers, worker: int) -> list[dict[str, object]]:
    """The virtual hosts made at run time that ``worker`` keeps in its own file."""
    kept: list[dict[str, object]] = json.loads(
        (workers.data_dir / f"worker-{worker}" / FILE_NAME).read_text()
    )
    return kept


def _refused(workers: Workers, worker: int, user: str, vhost: str) -> bool:
    try:
        workers.connection(worker, user, vhost).close()
    except ConnectionException:
        return True
    return False


def test_a_vhost_made_on_worker_0_is_entered_and_used_on_worker_1_with_its_grant(
    workers: Workers,
) -> None:
    vhost = "made-at-run-time"
    assert workers.api("PUT", f"/vhosts/{vhost}", {}) == 201
    near, far = _homed(vhost, 0, "near"), _homed(vhost, 1, "far")
    for queue in (near, far):
        _declare(workers, vhost, queue, {})
    # The creator's grant holds on worker 1; another administrator was granted nothing.
    publisher = workers.connection(1, "root", vhost)
    try:
        for queue in (near, far):
            sender = publisher.create_sender(f"/queues/{queue}")
            sender.send(Message(body=f"to {queue}"))
    finally:
        publisher.close()
    assert _refused(workers, 1, "ops", vhost)
    consumer = workers.connection(0, "root", vhost)
    try:
        for queue in (near, far):
            got = _take(consumer.create_receiver(f"/queues/{queue}", credit=10, name=queue), 1)
            assert [m.body for m in got] == [f"to {queue}"]
    finally:
        consumer.close()
    # Worker 1 keeps it in its own file, for its log at its next start.
    assert {"name": vhost, "granted": ["root"]} in _kept(workers, 1)
    assert workers.api("DELETE", f"/vhosts/{vhost}") == 204
    wait_until(lambda: _refused(workers, 1, "root", vhost))
    assert vhost not in [entry["name"] for entry in _kept(workers, 1)]


def _enters(workers: Workers, worker: int, vhost: str) -> bool:
    """Whether root enters ``vhost`` on ``worker`` (False too while it is not serving yet)."""
    try:
        workers.connection(worker, "root", vhost).close()
    except (ConnectionException, AssertionError):
        return False
    return True


@pytest.mark.slow
def test_a_worker_that_was_down_learns_the_vhosts_made_and_deleted_meanwhile(
    workers: Workers,
) -> None:
    kept, gone = "made-before", "deleted-meanwhile"
    for vhost in (kept, gone):
        assert workers.api("PUT", f"/vhosts/{vhost}", {}) == 201
    wait_until(lambda: _enters(workers, 1, gone))
    old = workers.pids[1]
    os.kill(old, signal.SIGKILL)
    assert workers.api("DELETE", f"/vhosts/{gone}") == 204
    assert workers.api("PUT", "/vhosts/made-meanwhile", {}) == 201
    restarted: list[int] = []

    def back() -> bool:
        restarted[:] = [pid for pid in children(workers.supervisor) if pid not in workers.pids]
        return bool(restarted)

    wait_until(back, timeout=30)
    # The module's other tests find worker 1 where it is now.
    workers.pids[1] = restarted[0]
    wait_until(lambda: _enters(workers, 1, "made-meanwhile"), timeout=30)
    assert _enters(workers, 1, kept)
    assert not _enters(workers, 1, gone)
    names = {entry["name"] for entry in _kept(workers, 1)}
    assert {kept, "made-meanwhile"} <= names
    assert gone not in names
