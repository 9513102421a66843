"""A classic queue's lazy heaps and lanes stay in proportion to the messages they name, and a
release costs the same however many filtered consumers the queue has (queues/compaction.py,
queues/ordering.py's ReleasedLog, docs/bounds.md "a queue's lazy heaps").

Each test repeats what a client can repeat for ever (acquire and release one message, settle
long before a lock runs out, take with a filter from a priority queue nobody else reads) and
holds the structures to a bound that does not grow with the repetitions."""

from __future__ import annotations

import sys
from dataclasses import replace

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.compaction import COMPACT_SLACK
from sluicegate.queues.filters.budget import READ_BUDGET
from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.ordering import RELEASED_LOG_MAX, Cursor, PriorityLanes
from sluicegate.queues.queue_type import Clock, ConsumerOptions, Outcome
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

CYCLES = 5 * COMPACT_SLACK


def _message(n: int, region: str = "us", size: int = 0) -> Message:
    properties = b"\x00\x53\x74" + encode({"region": region})
    return Message(properties + encode(Described(0x77, f"m{n}" + "x" * size)))


def _filtered(region: str) -> ConsumerOptions:
    views = ViewCache()
    return ConsumerOptions(filter=PropertiesFilter(views, None, {"region": region}), views=views)


def _cycle(queue: ClassicQueue, consumer: str, count: int, outcome: Outcome) -> int:
    """Take and settle one message ``count`` times; the consumer's delivery-count after."""
    delivery_count = 0
    for _ in range(count):
        got, reply = queue.credit(consumer, delivery_count, 1, False)
        delivery_count = reply.delivery_count
        assert len(got) == 1
        queue.settle(consumer, [got[0].seq], outcome, False)
    return delivery_count


def test_a_settled_delivery_is_not_kept_alive_by_its_lock_and_stale_locks_are_dropped() -> None:
    """Before, a lock's entry held its message until its deadline: with a consumer timeout
    of days, every settled message's bytes stayed in memory, counted by nothing."""
    queue = ClassicQueue("q", parse_arguments({"x-consumer-timeout": 10**12}), clock=Clock(1_000))
    queue.attach("c", ack_required=True)
    for n in range(CYCLES):
        message = _message(n, size=1_000)
        queue.enqueue(message)
        got, _ = queue.credit("c", n, 1, False)
        queue.settle("c", [got[0].seq], Outcome.ACCEPTED, False)
        del got
        # Only this test refers to it now (and getrefcount's argument): nothing of the queue.
        assert sys.getrefcount(message) == 2
    assert len(queue._deadlines.locks) <= COMPACT_SLACK + 1
    assert queue.statistics().unacked == 0


def test_releasing_one_message_again_and_again_grows_no_heap() -> None:
    """A TTL, a consumer timeout and a filtered consumer that takes the message too: each
    release pushed an expiry, a lock and an entry of the queue's order that nothing met."""
    queue = ClassicQueue(
        "q",
        parse_arguments({"x-consumer-timeout": 10**12, "x-message-ttl": 10**9}),
        clock=Clock(1_000),
    )
    queue.enqueue(_message(0, "eu"))
    queue.attach("plain", ack_required=True)
    queue.attach("eu", ack_required=True, options=_filtered("eu"))
    # The plain consumer takes it first, so the queue's order has moved past it.
    _cycle(queue, "plain", 1, Outcome.RELEASED)
    _cycle(queue, "eu", CYCLES, Outcome.RELEASED)
    deadlines = queue._deadlines
    assert len(deadlines.expiries) <= COMPACT_SLACK + 1
    assert len(deadlines.locks) <= COMPACT_SLACK + 1
    order = queue._order
    assert isinstance(order, Cursor)
    assert len(order.returned) <= COMPACT_SLACK + 1
    # And the message is still there, served in order.
    got, _ = queue.credit("plain", 1, 1, False)
    assert [m.seq for m in got] == [0]


def test_a_priority_queue_read_only_through_a_filter_keeps_no_lane_of_taken_messages() -> None:
    queue = ClassicQueue("q", parse_arguments({"x-max-priority": 5}), clock=Clock(1_000))
    queue.attach("eu", ack_required=False, options=_filtered("eu"))
    delivery_count = 0
    for n in range(CYCLES):
        queue.enqueue(_message(n, "eu"))
        got, reply = queue.credit("eu", delivery_count, 1, False)
        delivery_count = reply.delivery_count
        assert [m.seq for m in got] == [n]
    order = queue._order
    assert isinstance(order, PriorityLanes)
    entries = sum(map(len, order.lanes)) + sum(map(len, order.returned))
    assert entries <= COMPACT_SLACK + 1
    assert queue.statistics().ready == 0


def test_a_release_costs_one_entry_whatever_the_filtered_consumers() -> None:
    """200 filtered consumers with no credit, 50 DISPOSITIONs releasing 1,000 messages each:
    before, each consumer's heap took every release, 10,000,000 entries."""
    queue = ClassicQueue("q", clock=Clock(1_000))
    for n in range(1_000):
        queue.enqueue(_message(n))
    for i in range(200):
        queue.attach(f"f{i}", ack_required=True, options=_filtered("eu"))
    queue.attach("c", ack_required=True)
    delivery_count = 0
    for _ in range(50):
        got, reply = queue.credit("c", delivery_count, 1_000, False)
        delivery_count = reply.delivery_count
        assert len(got) == 1_000
        queue.settle("c", [m.seq for m in got], Outcome.RELEASED, False)
    log = queue._released
    assert len(log.seqs) <= RELEASED_LOG_MAX
    consumers = queue._consumers.by_key.values()
    assert sum(len(state.cursor.returned) for state in consumers) == 0


def test_a_filtered_consumer_gets_what_was_released_behind_it_after_the_log_was_cut() -> None:
    queue = ClassicQueue("q", clock=Clock(1_000))
    queue.enqueue(_message(0, "eu"))
    for n in range(1, 100):
        queue.enqueue(_message(n))
    queue.attach("holder", ack_required=True)
    got, _ = queue.credit("holder", 0, 1, False)
    assert [m.seq for m in got] == [0]
    queue.attach("eu", ack_required=True, options=_filtered("eu"))
    # It walks past the message the holder holds, then drains: no credit, nothing read since.
    delivered, reply = queue.credit("eu", 0, 5, False)
    assert delivered == []
    _, reply = queue.credit("eu", reply.delivery_count, 5, True)
    queue.settle("holder", [0], Outcome.RELEASED, False)
    # Another filtered consumer releases one of its own past what the log keeps.
    queue.attach("us", ack_required=True, options=_filtered("us"))
    _cycle(queue, "us", RELEASED_LOG_MAX + 10, Outcome.RELEASED)
    assert queue._released.base > 0
    got, _ = queue.credit("eu", reply.delivery_count, 5, False)
    assert [m.seq for m in got] == [0]


def test_a_browser_walks_a_long_gap_within_the_budget_and_is_served_at_the_next_ticks() -> None:
    """One message held unacked pins the start of the queue; 5 budgets' worth of messages
    consumed after it left gaps that every new browser walked in one call."""
    gap = 5 * READ_BUDGET
    queue = ClassicQueue("q", clock=Clock(1_000))
    queue.attach("hoarder", ack_required=True)
    queue.attach("eater", ack_required=False)
    queue.enqueue(_message(0))
    queue.credit("hoarder", 0, 1, False)
    for n in range(1, gap + 1):
        queue.enqueue(_message(n))
    queue.credit("eater", 0, gap, False)
    queue.enqueue(_message(gap + 1))
    queue.attach("b", ack_required=False, options=ConsumerOptions(browse=True))
    first, _ = queue.credit("b", 0, 10, False)
    # The held message, then the walk stops within its budget.
    assert [m.seq for m in first] == [0]
    assert queue._consumers.by_key["b"].cursor.position <= READ_BUDGET + 1
    assert queue.next_deadline() == queue.clock.now
    ticks = 0
    seen: list[int] = []
    while not seen:
        ticks += 1
        assert ticks <= gap // (READ_BUDGET // 2), "no progress"
        seen = [m.seq for key, m in queue.expire() if key == "b"]
    assert seen == [gap + 1]


def test_a_browser_behind_is_not_moved_past_what_it_did_not_read_by_a_new_message() -> None:
    """Before, a new message offered to a browser whose walk had stopped on the budget moved
    its cursor past every message it had not read yet."""
    count = 3 * READ_BUDGET
    queue = ClassicQueue("q", clock=Clock(1_000))
    for n in range(count):
        queue.enqueue(_message(n, "eu" if n % 7 == 0 else "us"))
    browsing = replace(_filtered("eu"), browse=True)
    queue.attach("b", ack_required=False, options=browsing)
    seen = [m.seq for m in queue.credit("b", 0, count, False)[0]]
    assert seen
    assert seen[-1] < count - 7
    queue.enqueue(_message(count, "eu"))
    ticks = 0
    while queue.next_deadline() == queue.clock.now:
        ticks += 1
        assert ticks <= count, "no progress"
        seen += [m.seq for key, m in queue.expire() if key == "b"]
    assert seen == [n for n in range(count) if n % 7 == 0] + [count]


def test_a_browser_given_back_deliveries_walks_them_again_without_a_new_request() -> None:
    queue = ClassicQueue("q", clock=Clock(1_000))
    queue.attach("b", ack_required=False, options=ConsumerOptions(browse=True))
    for n in range(4):
        queue.enqueue(_message(n))
    seen, _ = queue.credit("b", 0, 10, False)
    assert [m.seq for m in seen] == [0, 1, 2, 3]
    queue.give_back("b", seen[1:])
    again = [m.seq for key, m in queue.expire() if key == "b"]
    assert again == [1, 2, 3]
    assert [(key, m.seq) for key, m in queue.enqueue(_message(4))] == [("b", 4)]


def test_a_new_message_is_offered_only_to_the_browsers_that_wait() -> None:
    """Each new message walked every browser of the queue, with credit or not: O(browsers)
    per message for thousands of idle browsers one client attached."""
    queue = ClassicQueue("q", clock=Clock(1_000))
    for n in range(1_000):
        queue.attach(f"idle{n}", ack_required=False, options=ConsumerOptions(browse=True))
    queue.attach("b", ack_required=False, options=ConsumerOptions(browse=True))
    queue.credit("b", 0, 2, False)
    assert list(queue._consumers.browsing) == [queue._consumers.by_key["b"]]
    offered = [[key for key, _ in queue.enqueue(_message(n))] for n in range(3)]
    assert offered == [["b"], ["b"], []]
    assert not queue._consumers.browsing
    seen, _ = queue.credit("idle9", 0, 10, False)
    assert [m.seq for m in seen] == [0, 1, 2]
