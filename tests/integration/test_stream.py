"""Stream queues over AMQP: readers by offset spec, x-stream-offset on every delivery, restart."""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import pytest
from integration.conftest import RunningServer, start_server
from proton import Described, Message, Timeout, symbol, timestamp
from proton._data import PythonAMQPData
from proton.reactor import Filter
from proton.utils import BlockingConnection
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.durability import LOG_DIRECTORY
from sluicegate.queues.log.segments import list_segments

_SPEC = symbol("rabbitmq:stream-offset-spec")


def _declare(running: RunningServer, name: str, **arguments: object) -> None:
    running.call(
        lambda: running.server.registry.declare_queue(name, {"x-queue-type": "stream", **arguments})
    )


def _read(url: str, name: str, spec: PythonAMQPData, expect: int) -> list[tuple[int, str]]:
    """Attach with ``spec``, take ``expect`` messages and check nothing more is there."""
    connection = BlockingConnection(url)
    try:
        options = Filter({_SPEC: Described(_SPEC, spec)})
        receiver = connection.create_receiver(name, credit=1000, options=options)
        got = []
        for _ in range(expect):
            message = receiver.receive(timeout=20)
            got.append(_offset_and_body(message))
            receiver.accept()
        with contextlib.suppress(Timeout):
            extra = receiver.receive(timeout=1)
            pytest.fail(f"an unexpected message {extra.body!r}")
        return got
    finally:
        connection.close()


def _offset_and_body(message: Message) -> tuple[int, str]:
    assert message.annotations is not None
    offset = message.annotations["x-stream-offset"]
    assert isinstance(offset, int)
    assert isinstance(message.body, str)
    return offset, message.body


def _offsets(count: int, start: int = 0) -> list[tuple[int, str]]:
    return [(i, f"m{i}") for i in range(start, start + count)]


@pytest.mark.slow
def test_readers_start_at_first_an_offset_last_next_and_a_timestamp(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    try:
        _declare(running, "events")
        publish(running.url, "events", bodies=[f"m{i}" for i in range(10)])
        time.sleep(0.2)  # a gap in time between two batches, for the timestamp reader
        between = int(time.time() * 1000)
        time.sleep(0.2)
        publish(running.url, "events", bodies=[f"m{i}" for i in range(10, 15)])
        assert _read(running.url, "events", "first", 15) == _offsets(15)
        assert _read(running.url, "events", 4, 11) == _offsets(11, 4)
        assert _read(running.url, "events", "last", 1) == _offsets(1, 14)
        assert _read(running.url, "events", timestamp(between), 5) == _offsets(5, 10)
        assert _read(running.url, "events", "next", 0) == []
        stats = running.queue("events")
        assert (stats.first_offset, stats.last_offset, stats.ready) == (0, 14, 15)
    finally:
        running.stop()


def test_next_reads_only_what_comes_after_and_readers_do_not_consume(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    try:
        _declare(running, "ticks")
        publish(running.url, "ticks", bodies=["m0", "m1"])
        connection = BlockingConnection(running.url)
        options = Filter({_SPEC: Described(_SPEC, "next")})
        receiver = connection.create_receiver("ticks", credit=10, options=options)
        publish(running.url, "ticks", bodies=["m2"])
        message = receiver.receive(timeout=20)
        assert _offset_and_body(message) == (2, "m2")
        receiver.accept()
        connection.close()
        assert _read(running.url, "ticks", "first", 3) == _offsets(3)
    finally:
        running.stop()


def test_a_stream_and_its_offsets_survive_a_restart_with_retention(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    size = len(Message(body="m00", annotations={"x-stream-offset": 0}).encode())
    _declare(running, "kept", **{"x-max-length-bytes": 40 * (size + 40)})
    publish(running.url, "kept", bodies=[f"m{i}" for i in range(100)])
    before = running.queue("kept")
    assert before.first_offset is not None
    assert before.first_offset > 0
    running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        after = running.queue("kept")
        assert (after.first_offset, after.last_offset) == (before.first_offset, 99)
        publish(running.url, "kept", bodies=["m100"])
        # Retention goes on after the restart: the new message pushed the oldest out.
        first = running.queue("kept").first_offset
        assert first == before.first_offset + 1
        assert _read(running.url, "kept", "first", 101 - first) == _offsets(101 - first, first)
    finally:
        running.stop()


def test_a_stream_emptied_by_its_max_age_goes_on_at_its_offset_after_restarts(
    tmp_path: Path,
) -> None:
    """x-max-age drops every message and compaction their segments (small segments, so the
    record of the offset must be carried by a later segment's snapshot): after a restart the
    next message gets offset 30, not 0, and after a second restart 31."""
    running = start_server(data_dir=tmp_path, log_segment_size=4096)
    try:
        _declare(running, "aged", **{"x-max-age": "1s"})
        publish(running.url, "aged", bodies=[f"m{i}" for i in range(30)])
        wait_until(lambda: running.queue("aged").ready == 0, timeout=20)
        emptied_in = max(list_segments(tmp_path / LOG_DIRECTORY))
        # Other traffic rolls the log on past the stream's segments, and once it is settled
        # (its queue deleted) compaction deletes them all but the last.
        registry = running.server.registry
        filler = [Message(body="x" * 1000, durable=True) for _ in range(20)]
        for name in ("filler", "filler-2"):
            running.call(functools.partial(registry.declare_queue, name))
            publish(running.url, name, messages=filler)
            running.call(functools.partial(registry.delete_queue, name))
        assert min(list_segments(tmp_path / LOG_DIRECTORY)) > emptied_in
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path, log_segment_size=4096)
    try:
        stats = running.queue("aged")
        assert (stats.ready, stats.next_offset) == (0, 30)
        publish(running.url, "aged", bodies=["m30"])
        assert _read(running.url, "aged", "first", 1) == [(30, "m30")]
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path, log_segment_size=4096)
    try:
        # m30 may have aged out meanwhile, or not: either way the next message is 31.
        publish(running.url, "aged", bodies=["m31"])
        assert running.queue("aged").last_offset == 31
    finally:
        running.stop()


def test_deliveries_waiting_in_a_session_outlive_retention_and_their_segments(
    tmp_path: Path,
) -> None:
    """A reader's deliveries wait for its window while retention drops their messages and
    compaction deletes the segments they were in: they still arrive whole, in order."""
    running = start_server(data_dir=tmp_path, log_segment_size=4096, body_cache_size=0)
    client = RawClient.connect(running.host, running.port)
    try:
        _declare(running, "short", **{"x-max-length-bytes": 3000})
        publish(running.url, "short", bodies=[f"m{i}" for i in range(20)])
        log = tmp_path / LOG_DIRECTORY
        first_segment = min(list_segments(log))
        client.begin()
        spec = {"rabbitmq:stream-offset-spec": Described(_SPEC, "first")}
        handle = client.attach(
            "r", "receiver", source="short", filters=spec, snd_settle_mode="settled"
        )
        client.wait_attach(handle)
        client.flow(incoming_window=0)
        client.flow(handle, link_credit=20)

        def waiting() -> int:
            (connection,) = running.server.broker.connections
            (session,) = connection.sessions.values()
            return session.pure.statistics().pending_deliveries

        wait_until(lambda: running.call(waiting) == 20)
        publish(running.url, "short", bodies=[f"n{i}" for i in range(300)])
        assert (running.queue("short").first_offset or 0) > 20
        wait_until(lambda: min(list_segments(log)) > first_segment)
        client.flow(incoming_window=100)
        got = []
        for _ in range(20):
            delivery = client.next_message()
            assert delivery is not None
            message = Message()
            message.decode(delivery.payload)
            got.append(_offset_and_body(message))
        assert got == _offsets(20)
    finally:
        client.abort()
        running.stop()


def test_management_declares_a_stream_reports_its_offsets_and_deletes_it(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    connection = BlockingConnection(running.url)
    try:
        requests = connection.create_sender("/management", name="stream-mgmt")
        replies = connection.create_receiver("/management", name="stream-mgmt", credit=10)

        def request(method: str, path: str, body: dict[str, object] | None = None) -> Message:
            requests.send(Message(subject=method, address=path, reply_to="$me", body=body))
            return replies.receive(timeout=30)

        declared = request(
            "PUT", "/queues/managed", {"durable": True, "arguments": {"x-queue-type": "stream"}}
        )
        assert declared.subject == "201"
        publish(running.url, "managed", bodies=[f"m{i}" for i in range(7)])
        info = request("GET", "/queues/managed").body
        assert isinstance(info, dict)
        assert (info["type"], info["first_offset"], info["last_offset"]) == ("stream", 0, 6)
        assert info["next_offset"] == 7
        deleted = request("DELETE", "/queues/managed")
        # RabbitMQ's stream coordinator answers a stream's deletion with a count of 0.
        assert (deleted.subject, deleted.body) == ("200", {"message_count": 0})
    finally:
        connection.close()
        running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        assert running.call(lambda: running.server.registry.get("managed")) is None
    finally:
        running.stop()
