"""Publishing and consuming through a real server with real proton clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from proton import Timeout
from proton.utils import BlockingConnection
from support.clients import Holder, consume, publish
from support.polling import wait_until


@pytest.mark.slow
def test_ten_thousand_messages_in_order_unsettled(server: RunningServer) -> None:
    bodies = [f"m{i}" for i in range(10_000)]
    published = publish(server.url, "/queues/order-unsettled", bodies)
    assert published.outcomes == ["accepted"] * 10_000
    assert server.queue("order-unsettled").ready == 10_000
    received = consume(server.url, "/queues/order-unsettled", 10_000, credit=1000)
    assert received.bodies == bodies
    wait_until(lambda: server.queue("order-unsettled").unacked == 0)
    stats = server.queue("order-unsettled")
    assert (stats.ready, stats.acknowledged) == (0, 10_000)


@pytest.mark.slow
def test_ten_thousand_messages_in_order_settled(server: RunningServer) -> None:
    bodies = [f"m{i}" for i in range(10_000)]
    published = publish(server.url, "order-settled", bodies, presettled=True)
    assert len(published.outcomes) == 10_000
    wait_until(lambda: server.queue("order-settled").ready == 10_000)
    received = consume(server.url, "order-settled", 10_000, credit=1000, settled=True)
    assert received.bodies == bodies
    assert server.queue("order-settled").unacked == 0


def test_bare_and_v2_addresses_name_the_same_queue(server: RunningServer) -> None:
    publish(server.url, "same-queue", ["a"])
    publish(server.url, "/queues/same-queue", ["b"])
    publish(server.url, "amqp://somehost:5672/same-queue", ["c"])
    assert consume(server.url, "/queues/same-queue", 3).bodies == ["a", "b", "c"]


def test_percent_encoded_queue_name(server: RunningServer) -> None:
    publish(server.url, "/queues/my%20queue%2Fx", ["x"])
    assert server.queue("my queue/x").ready == 1
    assert consume(server.url, "/queues/my%20queue%2Fx", 1).bodies == ["x"]


def test_released_message_comes_back_before_later_ones(server: RunningServer) -> None:
    publish(server.url, "release-order", [f"m{i}" for i in range(5)])
    connection = BlockingConnection(server.url)
    try:
        receiver = connection.create_receiver("release-order", credit=2)
        assert receiver.receive(timeout=5).body == "m0"
        receiver.accept()
        assert receiver.receive(timeout=5).body == "m1"
        receiver.release(delivered=False)
    finally:
        connection.close()
    again = consume(server.url, "release-order", 4)
    assert again.bodies == ["m1", "m2", "m3", "m4"]
    assert again.messages[0].delivery_count == 0


def test_modified_delivery_failed_raises_delivery_count(server: RunningServer) -> None:
    publish(server.url, "modified", ["a", "b"])
    received = consume(
        server.url, "modified", 3, credit=1, decide=lambda m, i: "modify" if i == 0 else "accept"
    )
    # Proton sends the FLOW that renews credit before the DISPOSITION, so "b" may overtake.
    by_attempt = sorted((str(m.body), m.delivery_count) for m in received.messages)
    assert by_attempt == [("a", 0), ("a", 1), ("b", 0)]


def test_rejected_message_is_dropped(server: RunningServer) -> None:
    publish(server.url, "rejected", ["a", "b"])
    received = consume(
        server.url, "rejected", 2, decide=lambda m, i: "reject" if i == 0 else "accept"
    )
    assert received.bodies == ["a", "b"]
    wait_until(lambda: server.queue("rejected").unacked == 0)
    assert server.queue("rejected").ready == 0


def test_two_consumers_share_a_queue_round_robin(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        # Distinct names: proton refuses two links of one name on a connection.
        receivers = [
            connection.create_receiver("/queues/shared", credit=10, name=name)
            for name in ("first", "second")
        ]
        publish(server.url, "/queues/shared", [f"m{i}" for i in range(100)])
        bodies: list[list[str]] = [[], []]
        deadline = time.monotonic() + 20
        while sum(map(len, bodies)) < 100 and time.monotonic() < deadline:
            for index, receiver in enumerate(receivers):
                try:
                    message = receiver.receive(timeout=0.2)
                except Timeout:
                    continue
                receiver.accept()
                bodies[index].append(str(message.body))
        assert sorted(bodies[0] + bodies[1]) == sorted(f"m{i}" for i in range(100))
        assert 40 <= len(bodies[0]) <= 60, [len(b) for b in bodies]
        # Each consumer sees its share in queue order.
        for share in bodies:
            assert share == sorted(share, key=lambda body: int(body[1:]))
    finally:
        connection.close()


def test_unsettled_deliveries_of_a_closed_link_go_back(server: RunningServer) -> None:
    publish(server.url, "link-closed", ["a", "b", "c"])
    connection = BlockingConnection(server.url)
    try:
        holder = Holder(connection, "link-closed", credit=2)
        assert [m.body for m in holder.take(2)] == ["a", "b"]
        holder.receiver.link.close()
    finally:
        connection.close()
    received = consume(server.url, "link-closed", 3)
    assert received.bodies == ["a", "b", "c"]
    # a and b reached the client unsettled: they count one failed delivery attempt.
    assert [m.delivery_count for m in received.messages] == [1, 1, 0]


def test_consumer_killed_with_unsettled_deliveries_gives_them_back(
    server: RunningServer,
) -> None:
    publish(server.url, "killed", [f"m{i}" for i in range(10)])
    script = textwrap.dedent(
        f"""
        import sys, time
        from proton.utils import BlockingConnection
        from support.clients import Holder
        Holder(BlockingConnection({server.url!r}), "killed", credit=5).take(5)
        print("holding", flush=True)
        time.sleep(60)
        """
    )
    tests = str(Path(__file__).parents[1])  # where support.clients is
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": tests},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding"
        assert server.queue("killed").unacked == 5
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    wait_until(lambda: server.queue("killed").unacked == 0)
    received = consume(server.url, "killed", 10)
    assert received.bodies == [f"m{i}" for i in range(10)]
    assert [m.delivery_count for m in received.messages] == [1] * 5 + [0] * 5


@pytest.mark.parametrize("max_frame", [4096, 512])
def test_multi_frame_messages_arrive_intact(server: RunningServer, max_frame: int) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    address = f"multi-frame-{max_frame}"
    assert publish(server.url, address, [body, b"small"], max_frame=max_frame).outcomes == [
        "accepted",
        "accepted",
    ]
    received = consume(server.url, address, 2, max_frame=max_frame)
    assert [bytes(b) for b in received.bodies] == [body, b"small"]  # type: ignore[call-overload]


def test_attach_echoes_the_address(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        sender = connection.create_sender("/queues/echo%20me")
        assert sender.link.remote_target.address == "/queues/echo%20me"
        receiver = connection.create_receiver("echo-bare")
        assert receiver.link.remote_source.address == "echo-bare"
    finally:
        connection.close()
