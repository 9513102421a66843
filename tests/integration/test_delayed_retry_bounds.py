"""What a hostile consumer can park with RabbitMQ 4.3's delayed retry (issue 31): 500 messages
returned to 2^62 ms, its connection closed. They stay in their quorum queue as
RabbitMQ's would, each counted with its heap entry; deleting the queue gives every byte back;
the expiry timer and other clients go on (queues/delayed_returns.py, docs/bounds.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Delivery, Message, symbol
from proton.utils import BlockingConnection
from support.prober import Prober

from sluicegate.queues.delayed_returns import DELAYED_OVERHEAD

PARKED: Final = 500
# Far past any clock: parked for good.
FOREVER: Final = 2**62


@pytest.mark.slow
def test_messages_parked_for_ever_are_counted_and_go_with_their_queue(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server()
    registry = running.server.registry

    def declare() -> None:
        registry.declare_queue("dr-parked", {"x-queue-type": "quorum"})
        registry.declare_queue("dr-dead")
        registry.declare_queue(
            "dr-ttl",
            {
                "x-message-ttl": 100,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dr-dead",
            },
        )

    running.call(declare)
    empty = running.call(lambda: registry.held.total)
    with Prober(running.url) as prober:
        attacker = BlockingConnection(running.url, timeout=30)
        sender = attacker.create_sender("/queues/dr-parked")
        for index in range(PARKED):
            sender.send(Message(body=index))
        published = running.call(lambda: registry.held.total)
        receiver = attacker.create_receiver("/queues/dr-parked", credit=PARKED)
        for _ in range(PARKED):
            receiver.receive(timeout=30)
        fetcher = receiver.fetcher
        assert fetcher is not None
        while fetcher.unsettled:
            delivery = fetcher.unsettled.popleft()
            delivery.local.annotations = {symbol("x-opt-delivery-time"): FOREVER}
            delivery.update(Delivery.MODIFIED)
            delivery.settle()
        # Waiting on the connection sends the DISPOSITIONs.
        attacker.wait(lambda: running.queue("dr-parked").unacked == 0, timeout=30)
        # The attacker leaves: its returns are the queue's now, as in RabbitMQ.
        attacker.close()
        parked = running.call(lambda: registry.held.total)
        ready = running.queue("dr-parked").ready
        # The expiry timer goes on beside the parked messages.
        other = BlockingConnection(running.url, timeout=30)
        other.create_sender("/queues/dr-ttl").send(Message(body="late"))
        late = other.create_receiver("/queues/dr-dead", credit=1).receive(timeout=30)
        other.close()
        # The dead letter went back to its queue with the connection that did not settle it.
        running.call(lambda: registry.delete_queue("dr-dead"))
        running.call(lambda: registry.delete_queue("dr-parked"))
        prober.wait_rounds(len(prober.seen.rounds) + 3, timeout=30)
    assert ready == PARKED
    # Each parked message counted with its heap entry, on top of what it held (its stamped
    # redelivery counts and the outcome's annotation make it a little larger).
    assert parked - published >= PARKED * DELAYED_OVERHEAD
    assert late.body == "late"
    # Deleted, the queue gives back every byte its messages and their heap entries held.
    assert running.call(lambda: registry.held.total) == empty
    assert prober.seen.failures == []
