"""A consumer's ``modified`` outcome as RabbitMQ 4 defines it, with proton's own client.

``modified{delivery-failed, undeliverable-here}`` dead-letters the message (reason
``rejected``), and the outcome's ``message-annotations`` (``x-`` keys) stay with the message,
requeued or dead-lettered; any other key is refused with ``amqp:invalid-field``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from integration.conftest import RunningServer
from proton import Delivery, Message, symbol
from proton._data import PythonAMQPData
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached
from support.polling import wait_until


@pytest.fixture
def connection(server: RunningServer) -> Iterator[BlockingConnection]:
    opened = BlockingConnection(server.url, timeout=30)
    yield opened
    opened.close()


def _held(receiver: BlockingReceiver) -> Delivery:
    """The delivery a blocking receiver returned last and has not settled."""
    fetcher = receiver.fetcher
    assert fetcher is not None
    delivery: Delivery = fetcher.unsettled.popleft()
    return delivery


def _modify(
    delivery: Delivery,
    annotations: dict[str, PythonAMQPData],
    *,
    failed: bool = False,
    undeliverable: bool = False,
) -> None:
    delivery.local.failed = failed
    delivery.local.undeliverable = undeliverable
    delivery.local.annotations = annotations
    delivery.update(Delivery.MODIFIED)
    delivery.settle()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_modified_undeliverable_here_dead_letters_with_the_annotations(
    connection: BlockingConnection, server: RunningServer, queue_type: str
) -> None:
    source, dead = f"outcomes-{queue_type}", f"outcomes-{queue_type}-dead"

    def declare() -> None:
        registry = server.server.registry
        registry.declare_queue(dead)
        registry.declare_queue(
            source,
            {
                "x-queue-type": queue_type,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dead,
            },
        )

    server.call(declare)
    connection.create_sender(f"/queues/{source}").send(Message(body="doomed"))
    receiver = connection.create_receiver(f"/queues/{source}", credit=1)
    receiver.receive(timeout=10)
    delivery = _held(receiver)
    _modify(delivery, {symbol("x-opt-why"): "bad input"}, failed=True, undeliverable=True)
    receiver.close()  # type: ignore[no-untyped-call]
    wait_until(lambda: server.queue(dead).ready == 1)
    assert server.queue(source).ready == 0
    letter = connection.create_receiver(f"/queues/{dead}", credit=1).receive(timeout=10)
    assert letter.body == "doomed"
    annotations: dict[str, PythonAMQPData] = dict(letter.annotations or {})
    assert annotations[symbol("x-opt-why")] == "bad input"
    assert annotations[symbol("x-last-death-reason")] == "rejected"
    assert letter.delivery_count == 1


def test_a_reserved_annotation_key_detaches_the_consumer_and_changes_nothing(
    connection: BlockingConnection, server: RunningServer
) -> None:
    connection.create_sender("/queues/outcomes-reserved").send(Message(body="kept"))
    receiver = connection.create_receiver("/queues/outcomes-reserved", credit=1)
    receiver.receive(timeout=10)
    delivery = _held(receiver)
    _modify(delivery, {symbol("reason"): "not an x- key"})
    with pytest.raises(LinkDetached, match="invalid-field"):
        receiver.receive(timeout=10)
    # The message went back when the link detached, its header counting the failed delivery.
    wait_until(lambda: server.queue("outcomes-reserved").ready == 1)
    again = connection.create_receiver("/queues/outcomes-reserved", credit=1).receive(timeout=10)
    assert again.body == "kept"
    assert symbol("reason") not in (again.annotations or {})
