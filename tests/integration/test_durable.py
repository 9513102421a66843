"""Durable queues end to end: confirms after fsync, restarts, kill -9, a failing disk."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from integration.conftest import RunningServer, start_server
from proton import Event, Message, Timeout, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection
from support.clients import Holder, consume, publish
from support.faults import FailingDisk
from support.polling import wait_until

from sluicegate.gateway.events import delivery_of, link_of
from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.exchanges import ExchangeSettings, ExchangeType
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.log.paged import PAGED_MESSAGE_BYTES
from sluicegate.queues.paging import PAGE_MESSAGES, RESIDENT_READY

_SERVE = [sys.executable, "-m", "sluicegate", "serve", "--listen", "127.0.0.1:0"]
_LISTENING = re.compile(r"^sluicegate listening on amqp://127\.0\.0\.1:(\d+)$")


def _durable(bodies: range | list[int], durable: bool = True) -> list[Message]:
    return [Message(body=f"m{i}", durable=durable) for i in bodies]


def _restart(running: RunningServer, data_dir: Path) -> RunningServer:
    running.stop()
    return start_server(data_dir=data_dir)


def test_persistent_messages_survive_a_restart_and_transient_ones_do_not(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    mixed = [Message(body=f"m{i}", durable=i % 2 == 0) for i in range(200)]
    assert publish(running.url, "orders", messages=mixed).outcomes == ["accepted"] * 200
    running = _restart(running, tmp_path)
    try:
        assert running.queue("orders").ready == 100
        received = consume(running.url, "orders", 100)
        assert received.bodies == [f"m{i}" for i in range(0, 200, 2)]
        assert all(m.delivery_count == 0 for m in received.messages)
    finally:
        running.stop()


@pytest.mark.slow
def test_accepted_messages_are_not_redelivered_and_held_ones_come_back_counted(
    tmp_path: Path,
) -> None:
    running = start_server(data_dir=tmp_path)
    publish(running.url, "jobs", messages=_durable(range(50)))
    taker = BlockingConnection(running.url)
    taking = Holder(taker, "jobs", credit=20)
    taking.take(20)
    taking.accept()
    taker.close()
    wait_until(lambda: running.queue("jobs").acknowledged == 20)
    # A consumer that takes ten and settles none, then the server stops under it.
    holder = BlockingConnection(running.url)
    held = [message.body for message in Holder(holder, "jobs", credit=10).take(10)]
    assert held == [f"m{i}" for i in range(20, 30)]
    wait_until(lambda: running.queue("jobs").unacked == 10)
    running = _restart(running, tmp_path)
    with contextlib.suppress(Exception):
        holder.close()
    try:
        received = consume(running.url, "jobs", 30)
        assert received.bodies == [f"m{i}" for i in range(20, 50)]
        assert [m.delivery_count for m in received.messages] == [1] * 10 + [0] * 20
        assert running.queue("jobs").ready == 0
    finally:
        running.stop()


def test_released_and_modified_outcomes_survive_a_restart(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    publish(running.url, "q", messages=_durable(range(6)))
    outcomes = ["release", "modify", "accept", "accept", "release", "accept"]
    consume(running.url, "q", 6, decide=lambda m, i: outcomes[i])
    running = _restart(running, tmp_path)
    try:
        received = consume(running.url, "q", 3)
        assert received.bodies == ["m0", "m1", "m4"]
        assert [m.delivery_count for m in received.messages] == [0, 1, 0]
    finally:
        running.stop()


@pytest.mark.alone  # binds a default port: docs/testing.md
def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    try:
        process = subprocess.run(
            [*_SERVE, "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert process.returncode == 1
        assert "in use by another sluicegate server" in process.stderr
    finally:
        running.stop()


def test_a_full_disk_blocks_publishers_until_it_recovers_and_loses_nothing(
    make_server: object, tmp_path: Path
) -> None:
    disk = FailingDisk()
    disk.failing.set()
    running = start_server(disk, data_dir=tmp_path)
    try:
        result: list[list[str]] = []
        publisher = threading.Thread(
            target=lambda: result.append(
                publish(running.url, "full", messages=_durable(range(500))).outcomes
            )
        )
        publisher.start()

        def links_blocked() -> bool:
            links = running.call(lambda: list(running.server.broker.publishing.links))
            stats = [running.call(link.link.statistics) for link in links]
            return bool(stats) and all(s.credit == 0 and s.confirmed == 0 for s in stats)

        wait_until(links_blocked, timeout=30)
        wait_until(lambda: disk.refused >= 3, timeout=30)
        assert running.call(lambda: running.server.durability.failing)
        # Transient messages to the same server are still served.
        assert publish(running.url, "other", bodies=["x"]).outcomes == ["accepted"]
        disk.failing.clear()
        publisher.join(timeout=60)
        assert result == [["accepted"] * 500]
        assert not running.call(lambda: running.server.durability.failing)
        assert running.server.durability.statistics().failed_attempts >= 3
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        assert consume(running.url, "full", 500).bodies == [f"m{i}" for i in range(500)]
    finally:
        running.stop()


class _Flood(MessagingHandler):
    """Publishes numbered persistent messages until the server dies; records what was accepted."""

    def __init__(self, url: str) -> None:
        super().__init__(auto_settle=True)
        self.url = url
        self.sent = 0
        self.accepted: set[int] = set()
        self.started = threading.Event()

    def on_start(self, event: Event) -> None:
        assert event.container is not None
        connection = event.container.connect(self.url, reconnect=False)
        event.container.create_sender(connection, "crash")

    def on_sendable(self, event: Event) -> None:
        sender = link_of(event)
        while sender.credit > 0:
            delivery = sender.send(Message(body=self.sent, durable=True))
            setattr(delivery, "number", self.sent)  # noqa: B010
            self.sent += 1

    def on_accepted(self, event: Event) -> None:
        self.accepted.add(getattr(delivery_of(event), "number"))  # noqa: B009

    def on_transport_error(self, event: Event) -> None:
        if event.connection is not None:
            event.connection.close()


def _serve(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [*_SERVE, "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().rstrip("\n")
    match = _LISTENING.match(line)
    if match is None:
        assert process.stderr is not None
        process.kill()
        pytest.fail(f"first line {line!r}, stderr {process.stderr.read()!r}")
    return process, f"amqp://127.0.0.1:{match.group(1)}"


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)


@pytest.mark.alone  # binds a default port: docs/testing.md
@pytest.mark.slow
# 12,000 is past RESIDENT_READY: the queue was paging when the process died.
@pytest.mark.parametrize("after", [300, 3000, 12_000])
def test_kill_9_during_confirmed_publishes_loses_no_confirmed_message(
    tmp_path: Path, after: int
) -> None:
    process, url = _serve(tmp_path)
    flood = _Flood(url)
    container = Container(flood)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(flood.accepted) >= after, timeout=120)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        thread.join(timeout=30)
    finally:
        _stop(process)
    confirmed = set(flood.accepted)
    process, url = _serve(tmp_path)
    try:
        bodies = _drain(url, "crash")
    finally:
        _stop(process)
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    assert confirmed <= set(bodies), f"lost {len(confirmed - set(bodies))} confirmed messages"
    # Anything else is an uncertain message: sent, its confirmation lost in the crash.
    assert set(bodies) <= set(range(flood.sent))
    assert bodies == sorted(bodies)


def _drain(url: str, address: str) -> list[int]:
    """Every message of a queue, accepted, in order: until none comes for a few seconds."""
    connection = BlockingConnection(url)
    receiver = connection.create_receiver(address, credit=1000)
    bodies: list[int] = []
    try:
        while True:
            try:
                message = receiver.receive(timeout=5)
            except Timeout:
                return bodies
            assert isinstance(message.body, int)
            bodies.append(message.body)
            receiver.accept()
    finally:
        connection.close()


def test_recovered_messages_dead_letter_by_the_routing_key_they_were_published_with(
    tmp_path: Path,
) -> None:
    running = start_server(data_dir=tmp_path)
    registry = running.server.registry

    def declare() -> None:
        # No x-dead-letter-routing-key: dead letters keep their routing key (RabbitMQ).
        registry.declare_exchange("dlx", "direct")
        for region in ("eu", "us"):
            registry.declare_queue(f"dead-{region}")
        registry.bind("dlx", "dead-eu", "eu.paris")
        registry.bind("dlx", "dead-us", "us.nyc")
        registry.declare_exchange("orders", "topic")
        registry.declare_queue("work", {"x-dead-letter-exchange": "dlx"})
        registry.bind("orders", "work", "#")

    running.call(declare)
    eu = publish(running.url, "/exchanges/orders/eu.paris", messages=_durable(range(3)))
    # Its own message annotations: the server adds no x-exchange/x-routing-key to it, so only
    # what the log recorded at publish time knows its routing key.
    annotated = Message(body="m3", durable=True, annotations={symbol("x-opt-tag"): "kept"})
    us = publish(running.url, "/exchanges/orders/us.nyc", messages=[annotated])
    assert eu.outcomes + us.outcomes == ["accepted"] * 4
    running = _restart(running, tmp_path)
    try:
        assert running.queue("work").ready == 4
        rejected = consume(running.url, "/queues/work", 4, decide=lambda m, i: "reject")
        assert rejected.bodies == ["m0", "m1", "m2", "m3"]
        assert consume(running.url, "/queues/dead-eu", 3).bodies == ["m0", "m1", "m2"]
        [dead_us] = consume(running.url, "/queues/dead-us", 1).messages
        annotations = dead_us.annotations
        assert dead_us.body == "m3"
        assert annotations is not None
        assert annotations[symbol("x-opt-tag")] == "kept"
        [death] = annotations[symbol("x-opt-deaths")].elements
        assert (death[symbol("exchange")], death[symbol("routing-keys")].elements) == (
            "orders",
            ("us.nyc",),
        )
        assert running.server.registry.dead_letter_router.dropped == 0
    finally:
        running.stop()


def test_exchange_flags_and_their_bindings_survive_a_restart(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    registry = running.server.registry

    def declare() -> None:
        registry.declare_exchange("hidden", "topic", internal=True)
        registry.declare_exchange(
            "temporary", "fanout", auto_delete=True, arguments={"alternate-exchange": "hidden"}
        )
        registry.declare_exchange("transient", "direct", durable=False)
        registry.declare_queue("audit")
        registry.bind("hidden", "audit", "#")
        registry.bind("temporary", "audit")

    running.call(declare)
    before = running.call(lambda: {e.name: e.settings for e in registry.exchanges()})
    running = _restart(running, tmp_path)
    registry = running.server.registry
    try:
        after = running.call(lambda: {e.name: e.settings for e in registry.exchanges()})
        assert "transient" not in after
        del before["transient"]
        assert after == before
        assert after["hidden"] == ExchangeSettings(ExchangeType.TOPIC, internal=True)
        assert after["temporary"] == ExchangeSettings(
            ExchangeType.FANOUT, auto_delete=True, alternate_exchange="hidden"
        )
        bound = running.call(lambda: {(b.source, b.binding_key) for b in registry.bindings()})
        assert bound == {("hidden", "#"), ("temporary", "")}
        # An equivalent redeclaration is accepted; one that drops a flag is refused.
        running.call(lambda: registry.declare_exchange("hidden", "topic", internal=True))
        with pytest.raises(PreconditionFailed, match="inequivalent arg 'internal'"):
            running.call(lambda: registry.declare_exchange("hidden", "topic"))
        with pytest.raises(PreconditionFailed, match="inequivalent arg 'auto_delete'"):
            running.call(
                lambda: registry.declare_exchange(
                    "temporary", "fanout", arguments={"alternate-exchange": "hidden"}
                )
            )
    finally:
        running.stop()


def test_dead_lettered_persistent_messages_survive_a_restart_with_their_deaths(
    tmp_path: Path,
) -> None:
    running = start_server(data_dir=tmp_path)
    registry = running.server.registry

    def declare() -> None:
        registry.declare_exchange("dlx", "fanout")
        registry.declare_queue("dead")
        registry.bind("dlx", "dead", "")
        registry.declare_queue("work", {"x-dead-letter-exchange": "dlx"})
        registry.declare_queue("short", {"x-dead-letter-exchange": "dlx", "x-message-ttl": 1})

    running.call(declare)
    assert (
        publish(running.url, "/queues/work", messages=_durable(range(20))).outcomes
        == ["accepted"] * 20
    )
    rejected = consume(running.url, "/queues/work", 20, decide=lambda m, i: "reject")
    assert rejected.bodies == [f"m{i}" for i in range(20)]
    expiring = _durable(range(20, 25))
    assert publish(running.url, "/queues/short", messages=expiring).outcomes == ["accepted"] * 5
    wait_until(lambda: running.queue("dead").ready == 25)
    running = _restart(running, tmp_path)
    try:
        assert running.queue("work").ready == 0
        assert running.queue("short").ready == 0
        assert running.queue("dead").ready == 25
        # Dead-lettered in order: the rejections before the later publishes expired.
        dead = consume(running.url, "/queues/dead", 25)
        assert dead.bodies == [f"m{i}" for i in range(25)]
        for index, message in enumerate(dead.messages):
            annotations = message.annotations
            assert annotations is not None
            [death] = annotations[symbol("x-opt-deaths")].elements
            expected = ("work", "rejected") if index < 20 else ("short", "expired")
            assert (death[symbol("queue")], death[symbol("reason")]) == expected
            assert death[symbol("count")] == 1
            assert annotations[symbol("x-first-death-queue")] == expected[0]
        assert running.server.registry.dead_letter_router.dropped == 0
    finally:
        running.stop()


@pytest.mark.slow
def test_a_backlog_beyond_the_resident_messages_is_paged_and_comes_back_in_order(
    tmp_path: Path,
) -> None:
    """Persistent messages past RESIDENT_READY cost bytes, not objects, and lose nothing."""
    count = RESIDENT_READY + 3 * PAGE_MESSAGES
    running = start_server(data_dir=tmp_path)
    try:
        outcomes = publish(running.url, "backlog", messages=_durable(range(count))).outcomes
        assert outcomes == ["accepted"] * count
        paged = count - RESIDENT_READY
        held = running.call(lambda: running.server.registry.held.total)
        # The resident messages at their full overhead, the paged ones at a few bytes each.
        assert held <= RESIDENT_READY * MESSAGE_OVERHEAD + paged * PAGED_MESSAGE_BYTES
        assert running.queue("backlog").ready == count
        first = consume(running.url, "backlog", count // 2)
        assert first.bodies == [f"m{i}" for i in range(count // 2)]
        running = _restart(running, tmp_path)
        # Recovery reads no message: the whole backlog is pages pointing at the log.
        held = running.call(lambda: running.server.registry.held.total)
        assert held == (count - count // 2) * PAGED_MESSAGE_BYTES
        rest = consume(running.url, "backlog", count - count // 2)
        assert rest.bodies == [f"m{i}" for i in range(count // 2, count)]
        assert running.queue("backlog").ready == 0
        assert running.call(lambda: running.server.registry.held.total) == 0
    finally:
        running.stop()


def test_x_message_ttl_counts_from_arrival_across_a_restart(tmp_path: Path) -> None:
    """A recovered message keeps its TTL from when it arrived: not expired by the restart."""
    running = start_server(data_dir=tmp_path)
    running.call(lambda: running.server.registry.declare_queue("ttl", {"x-message-ttl": 3_600_000}))
    assert publish(running.url, "ttl", messages=_durable(range(3))).outcomes == ["accepted"] * 3
    running = _restart(running, tmp_path)
    try:
        assert consume(running.url, "ttl", 3).bodies == ["m0", "m1", "m2"]
        assert running.queue("ttl").expired == 0
    finally:
        running.stop()


def test_a_durable_priority_queue_serves_by_priority_before_and_after_a_restart(
    tmp_path: Path,
) -> None:
    """x-max-priority 5: priority 9 counts as 5; oldest first within a priority."""
    running = start_server(data_dir=tmp_path)
    running.call(lambda: running.server.registry.declare_queue("urgent", {"x-max-priority": 5}))
    priorities = [0, 9, 3, 5, 1, 3, 4, 0, 5, 2]
    messages = [Message(body=f"m{i}", durable=True, priority=p) for i, p in enumerate(priorities)]
    assert publish(running.url, "urgent", messages=messages).outcomes == ["accepted"] * 10
    # Highest first (9 counts as 5), then by age within a priority.
    order = sorted(range(10), key=lambda i: (-min(priorities[i], 5), i))
    expected = [f"m{i}" for i in order]
    assert consume(running.url, "urgent", 3, decide=lambda m, i: "release").bodies == expected[:3]
    running = _restart(running, tmp_path)
    try:
        assert consume(running.url, "urgent", 10).bodies == expected
    finally:
        running.stop()


def test_a_quorum_queue_keeps_every_message_across_a_restart(tmp_path: Path) -> None:
    """Persistent by default: transient messages to a quorum queue are logged too, and come
    back served as a quorum queue serves them (high priority two to one)."""
    running = start_server(data_dir=tmp_path)
    running.call(lambda: running.server.registry.declare_queue("votes", {"x-queue-type": "quorum"}))
    messages = [Message(body=f"m{i}", durable=False, priority=9 if i % 2 else 0) for i in range(6)]
    assert publish(running.url, "/queues/votes", messages=messages).outcomes == ["accepted"] * 6
    running = _restart(running, tmp_path)
    try:
        assert running.queue("votes").ready == 6
        received = consume(running.url, "/queues/votes", 6)
        assert received.bodies == ["m1", "m3", "m0", "m5", "m2", "m4"]
    finally:
        running.stop()
