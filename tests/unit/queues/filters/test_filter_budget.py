"""A filtered consumer of a classic queue walks its backlog within a budget per call: what is
left goes on at the next ticks, so no credit request or settlement walks a whole queue."""

from __future__ import annotations

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.filters.budget import EVALUATION_COST, READ_BUDGET
from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, Dispatch
from sluicegate.wire.codec import Described, encode


def _message(region: str, n: int) -> Message:
    payload = b"\x00\x53\x74" + encode({"region": region})
    return Message(payload + encode(Described(0x77, f"m{n}")))


def test_a_filter_that_matches_nothing_walks_a_bounded_share_of_the_queue_per_call() -> None:
    queue = ClassicQueue("q", parse_arguments(None), clock=Clock(1_000))
    total = 4 * READ_BUDGET
    for n in range(total):
        queue.enqueue(_message("us" if n < total - 1 else "eu", n))
    views = ViewCache()
    options = ConsumerOptions(filter=PropertiesFilter(views, None, {"region": "eu"}), views=views)
    queue.attach("eu", ack_required=True, options=options)
    delivered, reply = queue.credit("eu", 0, 5, False)
    assert delivered == []
    assert reply.credit == 5
    assert views.statistics().decodes <= READ_BUDGET // EVALUATION_COST
    # The queue is due at once: each tick walks on a budget's worth, until the match.
    assert queue.next_deadline() == queue.clock.now
    ticks = 0
    dispatched: list[Dispatch] = []
    while not dispatched:
        ticks += 1
        assert ticks <= total // (READ_BUDGET // (2 * EVALUATION_COST)), "no progress"
        dispatched = queue.expire()
    assert [(key, m.seq) for key, m in dispatched] == [("eu", total - 1)]
    # Each message was decoded once over all the ticks, and nothing more is due.
    assert views.statistics().decodes == total
    assert queue.next_deadline() is None


def test_an_unfiltered_consumer_is_served_whatever_the_filtered_ones_walk() -> None:
    queue = ClassicQueue("q", parse_arguments(None), clock=Clock(1_000))
    for n in range(3 * READ_BUDGET):
        queue.enqueue(_message("us", n))
    views = ViewCache()
    for key in ("eu-1", "eu-2"):
        options = ConsumerOptions(
            filter=PropertiesFilter(views, None, {"region": "eu"}), views=views
        )
        queue.attach(key, ack_required=True, options=options)
        queue.credit(key, 0, 10, False)
    queue.attach("any", ack_required=True)
    delivered, _ = queue.credit("any", 0, 3, False)
    assert [m.seq for m in delivered] == [0, 1, 2]
