"""A publisher's credit renewal that finds no room in the budget waits for room, and comes
once there is some (issue 31's adversary seed 65600, docs/inbound-flow-control.md).

The prober of that run, holding nothing, waited to publish for good while the budget was
blocked under its publishers' ceiling: its renewal had been popped in a flush with no headroom
left and dropped, and renewals are asked for only as credit falls or a hold ends. Here the
budget is taken past its ceiling by bytes no publisher holds (stored in a queue by the test
itself: the adversary's paths there are bugs of their own), a publisher attaches, then a
consumer takes the bytes back under the ceiling but not to the low-water mark, where every
hold ends and every renewal is made again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from integration.conftest import RunningServer
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.queues.message import Message
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

MiB: Final = 1024 * 1024
BUDGET: Final = 4 * MiB
BODY: Final = "r" * 100_000
# 100 KB messages past the ceiling (4.5 MiB): 48 of them.
MESSAGES: Final = 48
# What the consumer takes: 1 MB, back under the ceiling, still over the low-water mark (80 %).
TAKEN: Final = 10


def test_a_renewal_without_room_waits_and_comes_once_the_bytes_fall_under_the_ceiling(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=BUDGET)
    registry = running.server.registry
    budget = running.server.broker.publishing.budget

    def fill() -> None:
        registry.declare_queue("rw-full", {})
        registry.declare_queue("rw-prober", {})
        queue = registry.get("rw-full")
        assert queue is not None
        for _ in range(MESSAGES):
            queue.enqueue(Message(encode(Described(0x77, BODY))))

    running.call(fill)
    with RawClient.connect("127.0.0.1", running.port) as client:
        client.begin()
        # Traffic makes the server flush: the budget takes the bytes and blocks.
        wait_until(lambda: running.call(lambda: budget.blocked), 10)
        assert running.call(lambda: budget.used) >= budget.ceiling
        prober = client.attach("prober", "sender", target="/queues/rw-prober")
        assert client.wait_attach(prober).error is None
        assert client.links[prober].link_credit == 0, "attached past the ceiling: no credit"
        consumer = client.attach(
            "taker", "receiver", source="/queues/rw-full", snd_settle_mode="settled"
        )
        client.flow(consumer, link_credit=TAKEN)
        for _ in range(TAKEN):
            assert client.next_message(10) is not None
        used = running.call(lambda: budget.used)
        assert budget.resume_at < used < budget.ceiling
        assert running.call(lambda: budget.blocked)
        # The prober holds nothing: the margin backs its credit.
        assert client.wait_credit(prober, 10) > 0
