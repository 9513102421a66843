"""Ranges of settlements (DISPOSITION first..last) of a durable queue's deliveries, several in one
socket write, as a client settling in bulk sends them: each range does what its outcome says,
whatever comes after it in the same write, and a restart finds exactly that."""

from __future__ import annotations

from pathlib import Path

from integration.conftest import RunningServer, start_server
from proton import Message
from support.clients import consume, publish
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.rules.definitions import (
    BindingDefinition,
    ExchangeDefinition,
    QueueDefinition,
)


def _start(data_dir: Path) -> RunningServer:
    return start_server(
        data_dir=data_dir,
        queues=(
            QueueDefinition("runs", arguments={"x-dead-letter-exchange": "runs-dlx"}),
            QueueDefinition("runs-dead"),
        ),
        exchanges=(ExchangeDefinition("runs-dlx", "fanout"),),
        bindings=(BindingDefinition("runs-dlx", "runs-dead"),),
    )


def _receive_all(client: RawClient, count: int) -> int:
    """Attach to ``runs``, take ``count`` deliveries unsettled; the link's handle."""
    client.begin()
    handle = client.attach("bulk", "receiver", source="/queues/runs")
    client.wait_attach(handle)
    client.flow(handle, link_credit=count)
    for index in range(count):
        delivery = client.next_message(timeout=30)
        assert delivery is not None
        assert delivery.delivery_id == index
    return handle


def test_ranges_of_each_outcome_in_one_write_survive_a_restart_as_settled(
    tmp_path: Path,
) -> None:
    running = _start(tmp_path)
    messages = [Message(body=f"m{i}", durable=True) for i in range(100)]
    assert publish(running.url, "/queues/runs", messages=messages).outcomes == ["accepted"] * 100
    with RawClient.connect(running.host, running.port) as client:
        _receive_all(client, 100)
        with client.corked():
            client.disposition(0, 39, state="accepted")
            client.disposition(40, 49, state="released")
            client.disposition(50, 59, state="rejected")
            client.disposition(60, 69, state=("modified", True, False))
            client.disposition(70, 99, state="accepted")
        wait_until(lambda: running.queue("runs").unacked == 0)
        statistics = running.queue("runs")
        assert (statistics.acknowledged, statistics.rejected, statistics.ready) == (70, 10, 20)
        wait_until(lambda: running.queue("runs-dead").ready == 10)
    running.stop()
    running = _start(tmp_path)
    try:
        back = consume(running.url, "/queues/runs", 20).messages
        assert [m.body for m in back] == [f"m{i}" for i in range(40, 50)] + [
            f"m{i}" for i in range(60, 70)
        ]
        # Released is "not delivered" (AMQP 1.0 §3.4.4); modified with delivery-failed counts.
        assert [m.delivery_count for m in back] == [0] * 10 + [1] * 10
        dead = consume(running.url, "/queues/runs-dead", 10).messages
        assert [m.body for m in dead] == [f"m{i}" for i in range(50, 60)]
        assert running.queue("runs").ready == 0
    finally:
        running.stop()


def test_a_range_accepted_and_the_link_detached_in_one_write_stays_accepted(
    tmp_path: Path,
) -> None:
    running = _start(tmp_path)
    messages = [Message(body=f"m{i}", durable=True) for i in range(50)]
    publish(running.url, "/queues/runs", messages=messages)
    with RawClient.connect(running.host, running.port) as client:
        handle = _receive_all(client, 50)
        with client.corked():
            client.disposition(0, 29, state="accepted")
            client.detach(handle)
        client.wait_for("detach")
        wait_until(lambda: running.queue("runs").ready == 20)
        assert running.queue("runs").acknowledged == 30
    running.stop()
    running = _start(tmp_path)
    try:
        assert running.queue("runs").ready == 20
        back = consume(running.url, "/queues/runs", 20).messages
        assert [m.body for m in back] == [f"m{i}" for i in range(30, 50)]
        # Left unsettled by a consumer that went: possibly delivered, counted.
        assert all(m.delivery_count == 1 for m in back)
    finally:
        running.stop()


def test_a_range_settled_with_no_outcome_is_accepted_and_unsettled_ones_change_nothing(
    tmp_path: Path,
) -> None:
    running = _start(tmp_path)
    try:
        publish(running.url, "/queues/runs", messages=[Message(body=f"m{i}") for i in range(20)])
        with RawClient.connect(running.host, running.port) as client:
            _receive_all(client, 20)
            with client.corked():
                client.disposition(0, 9, settled=False, state=None)
                client.disposition(10, 19, state=None)
            wait_until(lambda: running.queue("runs").acknowledged == 10)
            assert running.queue("runs").unacked == 10
            client.disposition(0, 9, state="accepted")
            wait_until(lambda: running.queue("runs").acknowledged == 20)
    finally:
        running.stop()
