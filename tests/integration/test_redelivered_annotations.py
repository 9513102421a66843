"""A message a quorum queue delivers again carries ``x-delivery-count`` and
``x-acquired-count`` (RabbitMQ 4.2 and 4.3), with proton's own client: RabbitMQ's JavaScript
client's suite reads ``x-delivery-count`` after ``modified{delivery-failed=false}``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from integration.conftest import RunningServer
from proton import Delivery, Message, symbol
from proton._data import PythonAMQPData
from proton.utils import BlockingConnection, BlockingReceiver

COUNTS = (symbol("x-delivery-count"), symbol("x-acquired-count"))


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


def _annotations(message: Message) -> dict[str, PythonAMQPData]:
    return dict(message.annotations or {})


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_a_requeued_message_says_how_often_it_was_acquired(
    connection: BlockingConnection, server: RunningServer, queue_type: str
) -> None:
    name = f"redelivered-{queue_type}"
    server.call(lambda: server.server.registry.declare_queue(name, {"x-queue-type": queue_type}))
    connection.create_sender(f"/queues/{name}").send(Message(body="again"))
    receiver = connection.create_receiver(f"/queues/{name}", credit=1)
    first = receiver.receive(timeout=10)
    assert not set(COUNTS) & set(_annotations(first))
    delivery = _held(receiver)
    delivery.local.failed = False
    delivery.local.annotations = {symbol("x-opt-annotation-key"): "annotation-value"}
    delivery.update(Delivery.MODIFIED)
    delivery.settle()
    receiver.flow(1)
    second = receiver.receive(timeout=10)
    annotations = _annotations(second)
    assert annotations[symbol("x-opt-annotation-key")] == "annotation-value"
    # A return that did not fail: the header's delivery-count stays 0, as RabbitMQ keeps it.
    assert second.delivery_count == 0
    if queue_type == "quorum":
        assert [annotations[key] for key in COUNTS] == [1, 1]
    else:
        assert not set(COUNTS) & set(annotations)
    receiver.release()
    receiver.flow(1)
    third = receiver.receive(timeout=10)
    if queue_type == "quorum":
        assert [_annotations(third)[key] for key in COUNTS] == [2, 2]
    receiver.accept()
