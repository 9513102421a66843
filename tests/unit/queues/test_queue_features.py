"""The classic queue's features, pure: TTL, locks, dead letters, overflow, filters, browse,
priorities, single active consumer, and the bytes it holds."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.errors import InvalidFilter, ResourceLimitExceeded
from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerKey, ConsumerOptions, LockExpired, Outcome
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.encoding import encode

_PROPERTIES_PREFIX = b"\x00\x53\x73"
_APPLICATION_PREFIX = b"\x00\x53\x74"


def _holds(queue: ClassicQueue, key: ConsumerKey) -> set[int]:
    """The sequence numbers a consumer holds unsettled, as the queue keeps them."""
    state = queue._consumers.by_key.get(key)
    return set(state.unacked) if state is not None else set()


def _message(
    body: str,
    *,
    properties: list[Value] | None = None,
    application: dict[Value, Value] | None = None,
    expires: int | None = None,
) -> Message:
    payload = b""
    if properties is not None:
        payload += _PROPERTIES_PREFIX + encode(properties)
    if application is not None:
        payload += _APPLICATION_PREFIX + encode(application)
    payload += encode(Described(0x77, body))
    return Message(payload, expires=expires)


def _queue(arguments: dict[str, object] | None = None, now: int = 1_000) -> ClassicQueue:
    return ClassicQueue("q", parse_arguments(arguments), clock=Clock(now))


def _bodies(messages: list[Message]) -> list[bytes]:
    return [m.payload[-3:] for m in messages]


# -- TTL ------------------------------------------------------------------------------------


def test_expired_messages_are_never_delivered_and_are_dead_lettered() -> None:
    queue = _queue({"x-dead-letter-exchange": "dlx"})
    queue.enqueue(_message("m-a", expires=1_100))
    queue.enqueue(_message("m-b"))
    queue.enqueue(_message("m-c", expires=1_050))
    assert queue.next_deadline() == 1_050
    queue.clock.now = 1_200
    # Before the timer runs, delivery itself skips the dead ones.
    queue.attach("c", ack_required=True)
    delivered, reply = queue.credit("c", 0, 10, False)
    assert _bodies(delivered) == [b"m-b"]
    assert reply.available == 0
    stats = queue.statistics()
    assert (stats.expired, stats.dead_lettered, stats.ready) == (2, 2, 0)
    assert {letter.reason for letter in queue.dead_letters} == {"expired"}
    assert queue.expire() == []


def test_queue_ttl_applies_from_enqueue_and_the_timer_expires_the_head() -> None:
    queue = _queue({"x-message-ttl": 100})
    queue.enqueue(_message("m-a"))
    queue.clock.now = 1_050
    queue.enqueue(_message("m-b", expires=5_000))
    assert queue.next_deadline() == 1_100
    queue.clock.now = 1_100
    assert queue.expire() == []
    stats = queue.statistics()
    # No dead-letter exchange: dropped, and counted.
    assert (stats.ready, stats.expired, stats.dropped) == (1, 1, 1)
    assert queue.next_deadline() == 1_150


def test_ttl_zero_lives_only_if_a_consumer_takes_it_at_once() -> None:
    queue = _queue({"x-message-ttl": 0})
    assert queue.enqueue(_message("m-a")) == []
    assert queue.statistics().expired == 1
    queue.attach("c", ack_required=True)
    queue.credit("c", 0, 1, False)
    [(key, message)] = queue.enqueue(_message("m-b"))
    assert (key, _bodies([message])) == ("c", [b"m-b"])


# -- locks ----------------------------------------------------------------------------------


def test_lock_expiry_releases_with_a_failed_delivery_and_refuses_a_late_settlement() -> None:
    queue = _queue({"x-consumer-timeout": 500})
    queue.attach("slow", ack_required=True)
    queue.attach("other", ack_required=True)
    queue.enqueue(_message("m-a"))
    [message], _ = queue.credit("slow", 0, 1, False)
    queue.credit("other", 0, 1, False)
    assert queue.next_deadline() == 1_500
    queue.clock.now = 1_499
    assert queue.expire() == []
    queue.clock.now = 1_500
    [(key, again)] = queue.expire()
    assert (key, again.delivery_count) == ("other", 1)
    with pytest.raises(LockExpired, match="lock") as raised:
        queue.settle("slow", [message.seq], Outcome.ACCEPTED, False)
    assert raised.value.dispatches == []
    stats = queue.statistics()
    assert (stats.acknowledged, stats.unacked, stats.lock_expired) == (0, 1, 1)
    # The new holder settles normally.
    assert queue.settle("other", [again.seq], Outcome.ACCEPTED, False) == []
    assert queue.statistics().acknowledged == 1


def test_no_lock_by_default() -> None:
    queue = _queue()
    queue.attach("c", ack_required=True)
    queue.enqueue(_message("m-a"))
    queue.credit("c", 0, 1, False)
    assert queue.next_deadline() is None


# -- dead letters and delivery limit --------------------------------------------------------


def test_delivery_limit_dead_letters_after_too_many_failures() -> None:
    queue = _queue({"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    queue.attach("c", ack_required=True)
    queue.enqueue(_message("m-a"))
    for attempt in range(2):
        [message], _ = queue.credit("c", attempt, 1, False)
        assert message.delivery_count == attempt
        queue.settle("c", [message.seq], Outcome.MODIFIED, True)
    [letter] = queue.dead_letters
    assert (letter.reason, letter.exchange, letter.queue) == ("delivery_limit", "dlx", "q")
    assert queue.statistics().ready == 0


def test_rejected_goes_to_the_dead_letter_routing_key() -> None:
    queue = _queue({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    queue.attach("c", ack_required=True)
    queue.enqueue(_message("m-a"))
    [message], _ = queue.credit("c", 0, 1, False)
    queue.settle("c", [message.seq], Outcome.REJECTED, False)
    [letter] = queue.dead_letters
    assert (letter.reason, letter.exchange, letter.routing_key) == ("rejected", "", "dead")


# -- overflow -------------------------------------------------------------------------------


def test_reject_publish_refuses_and_stores_nothing() -> None:
    queue = _queue({"x-max-length": 1, "x-overflow": "reject-publish"})
    queue.enqueue(_message("m-a"))
    with pytest.raises(ResourceLimitExceeded) as raised:
        queue.enqueue(_message("m-b"))
    assert raised.value.condition == "amqp:resource-limit-exceeded"
    stats = queue.statistics()
    assert (stats.ready, stats.published, stats.overflowed, stats.dropped) == (1, 1, 1, 0)


def test_reject_publish_dlx_dead_letters_the_refused_message() -> None:
    queue = _queue(
        {
            "x-max-length-bytes": 10,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "d",
        }
    )
    queue.enqueue(Message(b"12345678"))
    with pytest.raises(ResourceLimitExceeded):
        queue.enqueue(Message(b"123"))
    assert [letter.reason for letter in queue.dead_letters] == ["maxlen"]


def test_drop_head_drops_the_oldest_ready_message() -> None:
    queue = _queue({"x-max-length": 2})
    queue.attach("c", ack_required=True)
    for name in ("m-a", "m-b", "m-c"):
        queue.enqueue(_message(name))
    stats = queue.statistics()
    assert (stats.ready, stats.overflowed, stats.dropped) == (2, 1, 1)
    delivered, _ = queue.credit("c", 0, 10, False)
    assert _bodies(delivered) == [b"m-b", b"m-c"]


# -- filters --------------------------------------------------------------------------------


def _region(name: str, region: str) -> Message:
    return _message(name, application={"region": region})


@pytest.mark.parametrize(
    ("expected", "actual", "matches"),
    [
        ("eu", "eu", True),
        ("eu", "us", False),
        ("&p:eu-", "eu-west", True),
        ("&p:eu-", "us-east", False),
        ("&s:-west", "eu-west", True),
        ("&s:-west", "eu-east", False),
        ("&&p:x", "&p:x", True),
        ("&&p:x", "p:x", False),
        (1, 1, True),
        (1, True, False),
        (True, 1, False),
        ("1", 1, False),
    ],
)
def test_application_properties_filter_semantics(
    expected: Value, actual: Value, matches: bool
) -> None:
    accept = PropertiesFilter(ViewCache(), None, {"k": expected})
    assert accept(_message("m-a", application={"k": actual})) is matches
    # A message without the key never matches.
    assert accept(_message("m-b", application={"other": actual})) is False


def test_properties_filter_reads_the_properties_section() -> None:
    accept = PropertiesFilter(ViewCache(), {"subject": "&p:order.", "group-id": "g1"}, None)
    properties: list[Value] = [None, None, None, "order.created", None, None]
    properties += [None, None, None, None, "g1"]
    assert accept(_message("m-a", properties=properties))
    properties[10] = "g2"
    assert not accept(_message("m-b", properties=properties))
    assert not accept(_message("m-c"))
    with pytest.raises(InvalidFilter, match="nonsense"):
        PropertiesFilter(ViewCache(), {"nonsense": 1}, None)


def test_a_filtered_consumer_skips_without_blocking_others() -> None:
    queue = _queue()
    eu = ConsumerOptions(filter=PropertiesFilter(ViewCache(), None, {"region": "eu"}))
    queue.attach("eu", ack_required=True, options=eu)
    queue.attach("any", ack_required=True)
    for i in range(6):
        queue.enqueue(_region(f"m-{i}", "eu" if i % 3 == 0 else "us"))
    delivered, _ = queue.credit("eu", 0, 10, False)
    assert _bodies(delivered) == [b"m-0", b"m-3"]
    others, _ = queue.credit("any", 0, 10, False)
    assert _bodies(others) == [b"m-1", b"m-2", b"m-4", b"m-5"]
    # New messages: the waiting filtered consumer gets the match, the other the rest.
    dispatched = queue.enqueue(_region("m-6", "us")) + queue.enqueue(_region("m-7", "eu"))
    assert [(key, _bodies([m])[0]) for key, m in dispatched] == [("any", b"m-6"), ("eu", b"m-7")]


def test_a_filtered_consumer_sees_a_matching_message_released_behind_its_cursor() -> None:
    queue = _queue()
    queue.attach("any", ack_required=True)
    queue.attach(
        "eu",
        ack_required=True,
        options=ConsumerOptions(filter=PropertiesFilter(ViewCache(), None, {"region": "eu"})),
    )
    queue.enqueue(_region("m-0", "eu"))
    queue.enqueue(_region("m-1", "us"))
    [first, _], _ = queue.credit("any", 0, 2, False)
    assert queue.credit("eu", 0, 5, False)[0] == []
    [(key, message)] = queue.settle("any", [first.seq], Outcome.RELEASED, False)
    assert (key, message.seq) == ("eu", first.seq)


# -- browse, priority, single active consumer --------------------------------------------------


def test_browse_copies_without_acquiring() -> None:
    queue = _queue()
    queue.attach("browser", ack_required=True, options=ConsumerOptions(browse=True))
    queue.attach("taker", ack_required=True)
    queue.enqueue(_message("m-a"))
    queue.enqueue(_message("m-b"))
    [held], _ = queue.credit("taker", 0, 1, False)
    copies, _ = queue.credit("browser", 0, 10, False)
    # The browser sees everything still in the queue, acquired or not, in order.
    assert _bodies(copies) == [b"m-a", b"m-b"]
    [(_, new)] = [d for d in queue.enqueue(_message("m-c")) if d[0] == "browser"]
    assert _bodies([new]) == [b"m-c"]
    stats = queue.statistics()
    assert (stats.ready, stats.unacked, stats.acknowledged) == (2, 1, 0)
    queue.settle("browser", [m.seq for m in copies], Outcome.ACCEPTED, False)
    assert queue.statistics().ready == 2
    assert held.seq == 0


def test_higher_priority_consumers_are_served_first() -> None:
    queue = _queue()
    queue.attach("low", ack_required=True)
    queue.attach("high", ack_required=True, options=ConsumerOptions(priority=10))
    queue.credit("low", 0, 10, False)
    queue.credit("high", 0, 2, False)
    keys = [key for i in range(4) for key, _ in queue.enqueue(_message(f"m-{i}"))]
    assert keys == ["high", "high", "low", "low"]


def test_single_active_consumer_hands_over_on_detach() -> None:
    queue = _queue({"x-single-active-consumer": True})
    queue.attach("first", ack_required=True)
    queue.attach("second", ack_required=True)
    queue.credit("first", 0, 1, False)
    delivered, reply = queue.credit("second", 0, 5, False)
    assert delivered == []
    assert reply.credit == 5
    keys = [key for i in range(3) for key, _ in queue.enqueue(_message(f"m-{i}"))]
    assert keys == ["first"]
    dispatched = queue.detach("first", [])
    assert [(key, m.delivery_count) for key, m in dispatched] == [
        ("second", 1),
        ("second", 0),
        ("second", 0),
    ]


# -- bytes held ------------------------------------------------------------------------------


def test_held_bytes_follow_every_way_a_message_leaves() -> None:
    queue = _queue({"x-max-length": 3, "x-message-ttl": 100})
    queue.attach("c", ack_required=True)
    queue.attach("s", ack_required=False)
    for _ in range(5):
        queue.enqueue(Message(b"x" * 10))
    each = 10 + MESSAGE_OVERHEAD
    assert queue.held.total == 3 * each
    [a, b], _ = queue.credit("c", 0, 2, False)
    queue.settle("c", [a.seq], Outcome.ACCEPTED, False)
    queue.settle("c", [b.seq], Outcome.MODIFIED, True)
    # The failed delivery inserted a header: its bytes count too.
    assert queue.held.total == each + len(b.payload) + MESSAGE_OVERHEAD
    queue.credit("s", 0, 1, False)
    assert queue.held.total == each
    queue.clock.now = 10_000
    queue.expire()
    assert queue.held.total == 0
    assert queue.statistics().ready_bytes == 0


def test_symbols_compare_as_strings_in_filters() -> None:
    accept = PropertiesFilter(ViewCache(), None, {"kind": "order"})
    assert accept(_message("m-a", application={"kind": Symbol("order")}))


# -- a model with filters, TTL, locks and browsing ---------------------------------------------


def _alive(expires: int | None, now: int) -> bool:
    return expires is None or expires > now


class FeatureMachine(RuleBasedStateMachine):
    """Filtered and browsing consumers, message TTLs and lock expiry against a model.

    Checked on every step: nothing is lost (each message is ready, held by exactly one
    consumer, stranded in the queue after its dead-lettering failed, or gone with a reason), no
    acquiring consumer receives a message that is not ready, an expired one, or one its filter
    refuses, an unfiltered consumer always gets the oldest live ready message, and the bytes
    held are those of the messages still in the queue. Poison messages fail dead-lettering.
    """

    def __init__(self) -> None:
        super().__init__()
        self.queue = _queue({"x-dead-letter-exchange": "dlx", "x-consumer-timeout": 300}, now=0)
        self.state: dict[int, str] = {}  # seq -> ready | held | stranded | gone
        self.messages: dict[int, Message] = {}
        self.poison: set[int] = set()
        self.region: dict[int, str] = {}
        self.expires: dict[int, int | None] = {}
        self.holder: dict[int, str] = {}
        self.consumers: dict[str, str | None] = {}  # key -> region filter (None: all)
        self.browsers: set[str] = set()
        self.delivery_counts: dict[str, int] = {}
        self.acquired_at: dict[int, int] = {}
        # (consumer, seq) whose lock expired: that consumer's next settlement of seq is refused.
        self.lost: set[tuple[str, int]] = set()
        self.names = 0

    def _live_ready(self) -> list[int]:
        now = self.queue.clock.now
        return sorted(
            s
            for s, state in self.state.items()
            if state == "ready" and _alive(self.expires[s], now)
        )

    def _hand_out(self, key: str, message: Message, in_order: bool) -> None:
        if key in self.browsers:
            assert self.state[message.seq] in ("ready", "held")
            return
        seq = message.seq
        assert self.state[seq] == "ready", f"{seq} handed to {key} while {self.state[seq]}"
        assert _alive(self.expires[seq], self.queue.clock.now)
        wanted = self.consumers[key]
        assert wanted is None or self.region[seq] == wanted
        if in_order and wanted is None:
            assert seq == self._live_ready()[0]
        self.state[seq] = "held"
        self.holder[seq] = key
        self.acquired_at[seq] = self.queue.clock.now

    def _dispatched(self, dispatches: list[tuple[object, Message]]) -> None:
        for key, message in dispatches:
            assert isinstance(key, str)
            self._hand_out(key, message, in_order=False)
        self._collect_dead_letters()

    def _collect_dead_letters(self) -> None:
        """The router's part: a poison message's dead-lettering fails, the others' succeed."""
        for letter in self.queue.dead_letters:
            seq = letter.message.seq
            assert self.state[seq] in ("ready", "held"), letter
            self.holder.pop(seq, None)
            if seq in self.poison:
                assert letter.failed()
                self.state[seq] = "stranded"
            else:
                letter.stored()
                self.state[seq] = "gone"
        self.queue.dead_letters.clear()

    @rule(
        region=st.sampled_from(["eu", "us"]),
        ttl=st.sampled_from([None, 50, 500]),
        poison=st.booleans(),
    )
    def enqueue(self, region: str, ttl: int | None, poison: bool) -> None:
        seq = self.queue.statistics().published
        expires = None if ttl is None else self.queue.clock.now + ttl
        self.state[seq] = "ready"
        self.region[seq] = region
        self.expires[seq] = expires
        if poison:
            self.poison.add(seq)
        message = _message("msg", application={"region": region}, expires=expires)
        self.messages[seq] = message
        self._dispatched(self.queue.enqueue(message))

    @rule()
    def purge(self) -> None:
        dropped = [s for s, state in self.state.items() if state in ("ready", "stranded")]
        assert self.queue.purge() == len(dropped)
        for seq in dropped:
            self.state[seq] = "gone"

    @rule(wanted=st.sampled_from([None, "eu", "us", "browse"]))
    def attach(self, wanted: str | None) -> None:
        key = f"c{self.names}"
        self.names += 1
        if wanted == "browse":
            self.browsers.add(key)
            options = ConsumerOptions(browse=True)
            self.consumers[key] = None
        else:
            views = ViewCache()
            accept = None if wanted is None else PropertiesFilter(views, None, {"region": wanted})
            options = ConsumerOptions(filter=accept)
            self.consumers[key] = wanted
        self.delivery_counts[key] = 0
        self.queue.attach(key, ack_required=True, options=options)

    @rule(data=st.data(), credit=st.integers(min_value=0, max_value=5))
    def credit(self, data: st.DataObject, credit: int) -> None:
        if not self.consumers:
            return
        key = data.draw(st.sampled_from(sorted(self.consumers)))
        delivered, reply = self.queue.credit(key, self.delivery_counts[key], credit, False)
        self.delivery_counts[key] = reply.delivery_count
        for message in delivered:
            self._hand_out(key, message, in_order=True)
        self._collect_dead_letters()

    @rule(data=st.data(), outcome=st.sampled_from(Outcome))
    def settle(self, data: st.DataObject, outcome: Outcome) -> None:
        held = sorted(s for s, state in self.state.items() if state == "held")
        if not held:
            return
        seq = data.draw(st.sampled_from(held))
        key = self.holder[seq]
        if (key, seq) in self.lost:
            self.lost.discard((key, seq))
            with pytest.raises(LockExpired):
                self.queue.settle(key, [seq], outcome, False)
            return
        if outcome is Outcome.ACCEPTED:
            self.state[seq] = "gone"
        elif outcome is not Outcome.REJECTED:
            self.state[seq] = "ready"
        del self.holder[seq]
        self._dispatched(self.queue.settle(key, [seq], outcome, False))
        # A rejected message is dead-lettered (collected above), or stranded if that failed.
        assert outcome is not Outcome.REJECTED or self.state[seq] in ("gone", "stranded")

    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        if not self.consumers:
            return
        key = data.draw(st.sampled_from(sorted(self.consumers)))
        del self.consumers[key]
        self.browsers.discard(key)
        self.lost = {entry for entry in self.lost if entry[0] != key}
        for seq in [s for s, k in self.holder.items() if k == key]:
            self.state[seq] = "ready"
            del self.holder[seq]
        self._dispatched(self.queue.detach(key, []))

    @rule(step=st.sampled_from([10, 100, 400]))
    def advance(self, step: int) -> None:
        self.queue.clock.now += step
        deadline = self.queue.next_deadline()
        if deadline is None or deadline > self.queue.clock.now:
            return
        # Lock expiry: every delivery held since before now - 300 goes back first.
        self._expire_locks()

    def _expire_locks(self) -> None:
        now = self.queue.clock.now
        for seq, key in list(self.holder.items()):
            if self.acquired_at[seq] + 300 <= now:
                self.state[seq] = "ready"
                del self.holder[seq]
                self.lost.add((key, seq))
        self._dispatched(self.queue.expire())

    @invariant()
    def nothing_lost(self) -> None:
        stats = self.queue.statistics()
        ready = sum(1 for state in self.state.values() if state == "ready")
        held = sum(1 for state in self.state.values() if state == "held")
        stranded = sum(1 for state in self.state.values() if state == "stranded")
        assert stats.published == len(self.state)
        assert stats.ready == ready
        assert stats.unacked == held
        # Kept as deliveries come and go (lock expiry among them), not summed over them.
        assert stats.unacked_bytes == sum(
            self.messages[s].held for s, state in self.state.items() if state == "held"
        )
        assert stats.dead_letter_failed == stranded
        assert self.queue.held.total == sum(
            m.held + MESSAGE_OVERHEAD for s, m in self.messages.items() if self.state[s] != "gone"
        )
        for key in self.consumers:
            assert _holds(self.queue, key) == {s for s, k in self.holder.items() if k == key}


FeatureMachine.TestCase.settings = settings(stateful_step_count=50, deadline=None)
test_feature_model = FeatureMachine.TestCase
