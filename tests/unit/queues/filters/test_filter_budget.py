"""A filtered consumer of a classic queue walks its backlog within a budget per call: what is
left goes on at the next ticks, so no credit request or settlement walks a whole queue."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.filters.budget import EVALUATION_COST, READ_BUDGET
from sluicegate.queues.filters.expression import COMPARED_CHARS_PER_UNIT
from sluicegate.queues.filters.like import LikePattern
from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.selector import parse_selector
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, Dispatch
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode


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


def _long_message(n: int, length: int) -> Message:
    payload = b"\x00\x53\x74" + encode({"p": "a" * length})
    return Message(payload + encode(Described(0x77, f"m{n}")))


def test_an_expensive_like_is_charged_what_it_costs_so_a_call_stops_after_its_share() -> None:
    """The hostile tester's LIKE: a pattern of 4,000 ``_`` against 60,000-character properties.
    Charged a flat 8 units, one call evaluated 512 of them (some 25 s of the reactor); charged
    its real cost, a call stops after the first, and the walk goes on at the next ticks."""
    queue = ClassicQueue("q", parse_arguments(None), clock=Clock(1_000))
    messages = 20
    for n in range(messages):
        queue.enqueue(_long_message(n, 60_000))
    views = ViewCache()
    selector = "p LIKE '%" + "_" * 3999 + "b'"
    options = ConsumerOptions(filter=parse_selector(selector, views, queue.clock), views=views)
    queue.attach("like", ack_required=True, options=options)
    delivered, _ = queue.credit("like", 0, 5, False)
    assert delivered == []
    assert LikePattern("%" + "_" * 3999 + "b").cost("a" * 60_000) > READ_BUDGET
    assert views.statistics().decodes == 1
    ticks = 0
    while views.statistics().decodes < messages:
        ticks += 1
        queue.expire()
        assert views.statistics().decodes == 1 + ticks
    assert queue.expire() == []
    assert queue.next_deadline() is None


@given(st.text(alphabet="ab_%", max_size=40), st.text(alphabet="ab", max_size=200))
def test_a_like_costs_at_least_a_unit_and_grows_with_its_subject(
    pattern: str, subject: str
) -> None:
    like = LikePattern(pattern)
    cost = like.cost(subject)
    assert cost >= 1
    assert like.cost(subject * 64) >= cost


def test_comparing_long_strings_is_charged_by_their_length() -> None:
    views = ViewCache()
    selected = parse_selector("p = 'b'", views, Clock(0))
    short, long = _long_message(0, 10), _long_message(1, 60_000)
    selected(short)
    after_short = views.work
    selected(long)
    assert views.work - after_short >= 60_000 // COMPARED_CHARS_PER_UNIT
    assert views.work - after_short > after_short


def test_new_messages_are_offered_to_filtered_consumers_within_the_budget() -> None:
    """Each published message was evaluated at once by every waiting filtered consumer, on no
    budget: a burst of messages under a 50 ms LIKE held the reactor for all of them. Past the
    budget a new message is left for the consumer's walk at the next tick, in order."""
    queue = ClassicQueue("q", parse_arguments(None), clock=Clock(1_000))
    views = ViewCache()
    selector = "p LIKE '%" + "_" * 3999 + "b'"
    options = ConsumerOptions(filter=parse_selector(selector, views, queue.clock), views=views)
    queue.attach("like", ack_required=True, options=options)
    assert queue.credit("like", 0, 5, False)[0] == []
    dispatched: list[Dispatch] = []
    for n in range(10):
        dispatched += queue.enqueue(_long_message(n, 60_000))
    matching = Message(
        b"\x00\x53\x74" + encode({"p": "a" * 59_999 + "b"}) + encode(Described(0x77, "match"))
    )
    dispatched += queue.enqueue(matching)
    assert dispatched == []
    # The first message spent the budget; the others wait for the walk.
    assert views.statistics().decodes == 1
    assert queue.next_deadline() == queue.clock.now
    ticks = 0
    while not dispatched:
        ticks += 1
        assert ticks <= 11, "no progress"
        dispatched = queue.expire()
        assert views.statistics().decodes <= 1 + ticks
    assert [(key, m.seq) for key, m in dispatched] == [("like", matching.seq)]
