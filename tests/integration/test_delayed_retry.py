"""RabbitMQ 4.3's delayed retry with proton's own client: a consumer settles with ``modified``
and ``x-opt-delivery-time``, and its quorum queue does not deliver the message again before
that time (queues/delayed_returns.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from integration.conftest import RunningServer
from proton import Delivery, Message, Timeout, symbol
from proton._data import PythonAMQPData
from proton.utils import BlockingConnection, BlockingReceiver
from support.polling import wait_until

from sluicegate.queues.delayed_returns import DELAYED_OVERHEAD

# How far ahead the consumer asks: long enough that a busy machine sees the message held back
# (within half of it) well before it is due.
DELAY_MS = 4_000


@pytest.fixture
def connection(server: RunningServer) -> Iterator[BlockingConnection]:
    opened = BlockingConnection(server.url, timeout=30)
    yield opened
    opened.close()


def _held(receiver: BlockingReceiver) -> Delivery:
    fetcher = receiver.fetcher
    assert fetcher is not None
    delivery: Delivery = fetcher.unsettled.popleft()
    return delivery


def test_a_delayed_retry_is_not_redelivered_before_its_time(
    connection: BlockingConnection, server: RunningServer
) -> None:
    name = "delayed-retry"
    server.call(lambda: server.server.registry.declare_queue(name, {"x-queue-type": "quorum"}))
    connection.create_sender(f"/queues/{name}").send(Message(body="retry me"))
    receiver = connection.create_receiver(f"/queues/{name}", credit=5)
    receiver.receive(timeout=10)
    delivery = _held(receiver)
    held = server.call(lambda: server.server.registry.held.total)
    due = time.time_ns() // 1_000_000 + DELAY_MS
    delivery.local.failed = True
    delivery.local.annotations = {symbol("x-opt-delivery-time"): due}
    delivery.update(Delivery.MODIFIED)
    delivery.settle()
    # Back in the queue, held by nobody, its heap entry charged to the held bytes.
    # Waiting sends the DISPOSITION; the message does not come back at once as it did before.
    with pytest.raises(Timeout):
        receiver.receive(timeout=0.2)
    wait_until(lambda: server.queue(name).unacked == 0, timeout=DELAY_MS / 2000)
    assert server.queue(name).ready == 1
    assert server.call(lambda: server.server.registry.held.total) > held + DELAYED_OVERHEAD // 2
    again = receiver.receive(timeout=DELAY_MS / 1000 + 30)
    arrived = time.time_ns() // 1_000_000
    assert arrived >= due
    assert again.body == "retry me"
    assert again.delivery_count == 1
    annotations: dict[str, PythonAMQPData] = dict(again.annotations or {})
    assert annotations[symbol("x-opt-delivery-time")] == due
    receiver.accept()
    receiver.close()  # type: ignore[no-untyped-call]
    wait_until(lambda: server.queue(name).unacked == server.queue(name).ready == 0)
