"""A consumer or publisher on one worker of a queue another worker owns (issue 35, stage 3):
served as by one process, over the channel between the two (docs/workers.md)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver
from support.polling import wait_until
from support.process import serving
from support.raw_client import RawClient
from support.workers import blocking_on, children, connection_on, homed_on, worker_of

from sluicegate.clients.management import ManagementClient

_OFF = ("--metrics-listen", "off", "--http-api-listen", "off")


def _raw(port: int, pids: list[int], wanted: int) -> RawClient:
    return connection_on(
        port, pids, wanted, lambda: RawClient.connect("127.0.0.1", port), RawClient.abort
    )


def _body(payload: bytes) -> str:
    message = Message()
    message.decode(payload)
    assert isinstance(message.body, str)
    return message.body


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], int]]:
    """A server of two workers: its port, its worker pids by index, and its supervisor."""
    with serving(
        "--workers", "2", "--worker-handover", "false", "--data-dir", str(tmp_path), *_OFF
    ) as (process, port):
        pids = children(process.pid)
        yield port, sorted(pids, key=worker_of), process.pid


def test_a_consumer_gets_a_remote_queues_messages_in_order_within_its_credit_and_drains(
    two_workers: tuple[int, list[int], int],
) -> None:
    port, pids, _ = two_workers
    queue = homed_on(1, 2, "far")
    consumer = _raw(port, pids, pids[0])
    on_home = blocking_on(port, pids, pids[1])
    on_consumer = blocking_on(port, pids, pids[0])
    try:
        consumer.begin()
        handle = consumer.attach("far", "receiver", source=f"/queues/{queue}")
        assert consumer.wait_attach(handle).error is None
        # Published where the queue lives and where its consumer is, in turns.
        home_sender = on_home.create_sender(queue)
        far_sender = on_consumer.create_sender(queue)
        for n in range(150):
            home_sender.send(Message(body=f"home-{n}"))
            far_sender.send(Message(body=f"far-{n}"))
        bodies: list[str] = []
        granted = 0
        while len(bodies) < 300:
            # Small grants: the queue's batches may never outrun what the client allowed.
            consumer.flow(handle, link_credit=7)
            granted += 7
            while len(bodies) < min(granted, 300):
                delivery = consumer.next_message()
                assert delivery is not None, f"{len(bodies)} of {granted} granted arrived"
                bodies.append(_body(delivery.payload))
                consumer.disposition(delivery.delivery_id)
            # Nothing beyond the credit, though the queue holds more.
            assert consumer.next_message(0.05) is None
        assert [b for b in bodies if b.startswith("home")] == [f"home-{n}" for n in range(150)]
        assert [b for b in bodies if b.startswith("far")] == [f"far-{n}" for n in range(150)]
        # A drain on the emptied queue: answered at once, its credit spent on nothing.
        consumer.flow(handle, link_credit=50, drain=True)
        flow = consumer.wait_for("flow", where=lambda f: f["handle"] is not None and f["drain"])
        assert flow["link_credit"] == 0
        assert flow["delivery_count"] == 350
        assert consumer.next_message(0.3) is None
    finally:
        consumer.abort()
        on_home.close()
        on_consumer.close()


def test_a_publisher_is_settled_once_the_owner_stored_its_message_which_survives_a_kill(
    two_workers: tuple[int, list[int], int],
) -> None:
    port, pids, supervisor = two_workers
    queue = homed_on(1, 2, "kept")
    publisher = blocking_on(port, pids, pids[0])
    sender = publisher.create_sender(queue)
    for n in range(50):
        # Returns once settled: the owner logged and fsynced it before it confirmed.
        sender.send(Message(body=f"kept-{n}", durable=True))
    os.kill(pids[1], signal.SIGKILL)
    pids = [pids[0], _restarted(supervisor, pids)]
    # Attaches are refused cleanly until the restarted worker's channel is up.
    consumer = blocking_on(port, pids, pids[0])
    receiver = wait_until_attached(consumer, queue)
    bodies = []
    for _ in range(50):
        bodies.append(receiver.receive(timeout=10).body)
        receiver.accept()
    assert bodies == [f"kept-{n}" for n in range(50)]
    publisher.close()
    consumer.close()


def _restarted(supervisor: int, pids: list[int]) -> int:
    """The worker process the supervisor forked in place of one of ``pids``."""
    restarted: list[int] = []

    def back() -> bool:
        restarted[:] = [pid for pid in children(supervisor) if pid not in pids]
        return bool(restarted)

    wait_until(back, timeout=30)
    return restarted[0]


def wait_until_attached(connection: BlockingConnection, queue: str) -> BlockingReceiver:
    """A receiver of ``queue`` once its owner serves again (a refusal before is clean)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return connection.create_receiver(queue)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_killed_owner_detaches_its_queues_remote_consumers_who_attach_again(
    two_workers: tuple[int, list[int], int],
) -> None:
    port, pids, supervisor = two_workers
    queue = homed_on(1, 2, "lost")
    consumer = _raw(port, pids, pids[0])
    consumer.begin()
    handle = consumer.attach("lost", "receiver", source=f"/queues/{queue}")
    assert consumer.wait_attach(handle).error is None
    consumer.flow(handle, link_credit=10)
    os.kill(pids[1], signal.SIGKILL)
    detach = consumer.wait_for("detach", timeout=20)
    assert detach["error"] is not None
    assert detach["error"]["condition"] == "amqp:resource-deleted"
    # The consumer's own worker went on: its connection is open, and attaches once the owner
    # serves again.
    again_pid = _restarted(supervisor, pids)
    publisher = blocking_on(port, [pids[0], again_pid], again_pid)
    deadline = time.monotonic() + 30
    again = -1
    while time.monotonic() < deadline:
        again = consumer.attach(f"again-{time.monotonic()}", "receiver", source=f"/queues/{queue}")
        if consumer.wait_attach(again).error is None:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the consumer could not attach again")
    publisher.create_sender(queue).send(Message(body="after"))
    consumer.flow(again, link_credit=1)
    delivery = consumer.next_message(10)
    assert delivery is not None
    assert _body(delivery.payload) == "after"
    consumer.abort()
    publisher.close()


def test_an_exchange_and_binding_declared_on_one_worker_route_on_every_worker(
    two_workers: tuple[int, list[int], int],
) -> None:
    port, pids, _ = two_workers
    queues = {home: homed_on(home, 2, "bound") for home in (0, 1)}
    declaring = connection_on(
        port,
        pids,
        pids[0],
        lambda: ManagementClient(f"amqp://127.0.0.1:{port}"),
        ManagementClient.close,
    )
    with declaring as client:
        exchange = {"type": "fanout", "durable": True, "internal": False, "arguments": {}}
        assert client.request("PUT", "/exchanges/spread", exchange).status == 204
        for name in queues.values():
            assert client.request("PUT", f"/queues/{name}", {"durable": True}).status == 201
            binding = {"source": "spread", "destination_queue": name, "arguments": {}}
            assert client.request("POST", "/bindings", binding).status == 204
    # Published on the other worker: its own copy of the topology routes, one copy per queue.
    publisher = blocking_on(port, pids, pids[1])
    wait_until(lambda: _published(publisher, "/exchanges/spread"), timeout=10)
    for name in queues.values():
        receiver = publisher.create_receiver(name)
        assert receiver.receive(timeout=10).body == "fanned"
        receiver.accept()
    publisher.close()


def _published(connection: BlockingConnection, address: str) -> bool:
    """Whether a message to ``address`` was accepted (the topology may still be crossing)."""
    try:
        connection.create_sender(address).send(Message(body="fanned"))
    except Exception:
        return False
    return True


def test_a_run_of_publishes_the_owners_full_queue_refuses_in_part_settles_each_as_stored(
    two_workers: tuple[int, list[int], int],
) -> None:
    port, pids, _ = two_workers
    queue = homed_on(1, 2, "capped")
    owner = connection_on(
        port, pids, pids[1], lambda: ManagementClient(f"amqp://127.0.0.1:{port}"),
        ManagementClient.close,
    )  # fmt: skip
    try:
        body = {"durable": False, "arguments": {"x-max-length": 3, "x-overflow": "reject-publish"}}
        assert owner.request("PUT", f"/queues/{queue}", body).ok
    finally:
        owner.close()
    publisher = _raw(port, pids, pids[0])
    try:
        publisher.begin()
        handle = publisher.attach("capped", "sender", target=f"/queues/{queue}")
        publisher.wait_attach(handle)
        publisher.wait_credit(handle)
        # Read together, so that the five cross as one run: three stored, two refused.
        with publisher.corked():
            sent = [publisher.send(handle, Message(body=f"m{n}").encode()) for n in range(5)]
        outcomes = publisher.wait_outcomes(sent)
        names = [outcome.name if outcome is not None else None for outcome in outcomes.values()]
        assert names == ["accepted"] * 3 + ["rejected"] * 2
        refused = outcomes[sent[3]]
        assert refused is not None
        assert refused["error"]["condition"] == "amqp:resource-limit-exceeded"
        # Then the queue takes more once it has room: the run after a refusal is stored again.
        consumer = blocking_on(port, pids, pids[0])
        try:
            receiver = consumer.create_receiver(queue, credit=3)
            taken = [receiver.receive(timeout=10) for _ in range(3)]
            assert [message.body for message in taken] == ["m0", "m1", "m2"]
            receiver.accept()
            with publisher.corked():
                again = [publisher.send(handle, Message(body="m5").encode())]
            assert [o.name for o in publisher.wait_outcomes(again).values() if o] == ["accepted"]
        finally:
            consumer.close()
    finally:
        publisher.abort()
