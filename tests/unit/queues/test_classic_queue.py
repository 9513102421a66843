"""The classic queue against a model: order, credit, outcomes and consumers coming and going."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from sluicegate.queues.arguments import QueueArguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.paging import Page, append_in_memory
from sluicegate.queues.queue_type import ConsumerKey, CreditReply, Dispatch, Outcome
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.envelope import read_envelope
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import Header, encode_header, read_header
from sluicegate.wire.serial import SERIAL_MASK, serial_add


def _holds(queue: ClassicQueue, key: ConsumerKey) -> set[int]:
    """The sequence numbers a consumer holds unsettled, as the queue keeps them."""
    state = queue._consumers.by_key.get(key)
    return set(state.unacked) if state is not None else set()


def _payload(i: int) -> bytes:
    return encode(Described(0x77, f"m{i}"))


# -- examples ------------------------------------------------------------------------------


def test_credit_delivers_in_order_then_replies() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    for i in range(5):
        assert queue.enqueue(Message(_payload(i))) == []
    delivered, reply = queue.credit("c", 0, 3, False)
    assert [m.seq for m in delivered] == [0, 1, 2]
    assert reply == CreditReply(delivery_count=3, credit=0, available=2, drain=False)
    assert queue.available == queue.statistics().ready == 2
    assert queue.statistics().unacked == 3


def test_credit_beyond_available_waits_for_enqueues() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=False)
    queue.enqueue(Message(b"a"))
    delivered, reply = queue.credit("c", 0, 3, False)
    assert [m.seq for m in delivered] == [0]
    assert reply == CreditReply(1, 2, 0, False)
    # The remaining credit takes the next two messages as they arrive.
    for seq in (1, 2):
        dispatches = queue.enqueue(Message(b"m"))
        assert [(k, m.seq) for k, m in dispatches] == [("c", seq)]
    # The credit is used up: the next message waits.
    assert queue.enqueue(Message(b"d")) == []
    assert queue.available == 1


def test_drain_advances_delivery_count_by_unused_credit() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    queue.enqueue(Message(b"a"))
    delivered, reply = queue.credit("c", 0, 10, True)
    assert len(delivered) == 1
    assert reply == CreditReply(delivery_count=10, credit=0, available=0, drain=True)
    # Nothing is held for the drained consumer.
    assert queue.enqueue(Message(b"b")) == []


def test_drain_with_huge_credit_wraps_the_delivery_count() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=False)
    _, reply = queue.credit("c", 0, 2_000_000_000, True)
    assert reply.delivery_count == 2_000_000_000
    _, reply = queue.credit("c", reply.delivery_count, 2_000_000_000, True)
    assert reply.delivery_count == 4_000_000_000
    queue.enqueue(Message(b"a"))
    delivered, reply = queue.credit("c", reply.delivery_count, 2_000_000_000, True)
    assert len(delivered) == 1
    assert reply.delivery_count == (6_000_000_000 & SERIAL_MASK)
    assert reply.credit == 0


def test_credit_with_a_stale_delivery_count_counts_deliveries_in_flight() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=False)
    for i in range(10):
        queue.enqueue(Message(_payload(i)))
    delivered, _ = queue.credit("c", 0, 4, False)
    assert len(delivered) == 4
    # The session has not seen those 4 leave yet: credit 6 from count 0 leaves 2.
    delivered, reply = queue.credit("c", 0, 6, False)
    assert [m.seq for m in delivered] == [4, 5]
    assert reply == CreditReply(6, 0, 4, False)
    # Lowering credit below what is in flight gives none (floor of 0).
    delivered, reply = queue.credit("c", 0, 1, False)
    assert delivered == []
    assert reply == CreditReply(6, 0, 4, False)


def test_fair_dispatch_alternates_between_two_consumers() -> None:
    queue = ClassicQueue("q")
    queue.attach("a", ack_required=True)
    queue.attach("b", ack_required=True)
    assert queue.credit("a", 0, 5, False)[0] == []
    assert queue.credit("b", 0, 5, False)[0] == []
    dispatched: list[ConsumerKey] = []
    for i in range(10):
        for key, _ in queue.enqueue(Message(_payload(i))):
            dispatched.append(key)
    assert dispatched == ["a", "b"] * 5
    assert queue.enqueue(Message(b"x")) == []


def test_requeued_messages_alternate_between_consumers_with_credit() -> None:
    queue = ClassicQueue("q")
    for key in ("a", "b", "c"):
        queue.attach(key, ack_required=True)
    for i in range(4):
        queue.enqueue(Message(_payload(i)))
    delivered, _ = queue.credit("c", 0, 4, False)
    queue.credit("a", 0, 2, False)
    queue.credit("b", 0, 2, False)
    dispatches = queue.settle("c", [m.seq for m in delivered], Outcome.RELEASED, False)
    assert [(k, m.seq) for k, m in dispatches] == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]


def test_released_message_returns_to_its_original_position() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    for i in range(6):
        queue.enqueue(Message(_payload(i)))
    delivered, _ = queue.credit("c", 0, 4, False)
    assert [m.seq for m in delivered] == [0, 1, 2, 3]
    queue.settle("c", [3, 1], Outcome.RELEASED, False)
    queue.settle("c", [0, 2], Outcome.ACCEPTED, False)
    delivered, _ = queue.credit("c", 4, 10, False)
    assert [m.seq for m in delivered] == [1, 3, 4, 5]
    # Released does not count as a failed delivery.
    assert all(m.delivery_count == 0 for m in delivered)


def test_outcomes() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    for i in range(4):
        queue.enqueue(Message(_payload(i)))
    delivered, _ = queue.credit("c", 0, 4, False)
    by_seq = {m.seq: m for m in delivered}
    assert queue.settle("c", [0], Outcome.ACCEPTED, False) == []
    assert queue.settle("c", [1], Outcome.REJECTED, False) == []
    assert queue.settle("c", [2], Outcome.MODIFIED, True) == []
    assert queue.settle("c", [3], Outcome.MODIFIED, False) == []
    assert by_seq[2].delivery_count == 1
    assert read_header(by_seq[2].read()).delivery_count == 1
    assert by_seq[3].delivery_count == 0
    stats = queue.statistics()
    assert (stats.ready, stats.unacked, stats.acknowledged, stats.rejected) == (2, 0, 1, 1)
    # Without a dead-letter exchange a rejected message is dropped, and counted.
    assert (stats.dropped, stats.dead_lettered) == (1, 0)
    # Unknown or repeated sequence numbers are ignored.
    assert queue.settle("c", [0, 99], Outcome.ACCEPTED, False) == []
    assert queue.settle("nobody", [2], Outcome.ACCEPTED, False) == []
    assert queue.statistics().acknowledged == 1


def test_detach_returns_unsent_as_they_were_and_counts_the_rest_as_failed() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    for i in range(4):
        queue.enqueue(Message(_payload(i)))
    delivered, _ = queue.credit("c", 0, 4, False)
    assert queue.detach("c", [delivered[2], delivered[3]]) == []
    assert [m.delivery_count for m in delivered] == [1, 1, 0, 0]
    assert [read_header(m.read()).delivery_count for m in delivered] == [1, 1, 0, 0]
    assert queue.statistics().consumers == 0
    queue.attach("d", ack_required=True)
    again, _ = queue.credit("d", 0, 10, False)
    assert [m.seq for m in again] == [0, 1, 2, 3]
    assert queue.detach("nobody", []) == []


def test_detach_dispatches_to_waiting_consumers() -> None:
    queue = ClassicQueue("q")
    queue.attach("a", ack_required=True)
    queue.attach("b", ack_required=True)
    queue.enqueue(Message(b"x"))
    queue.credit("a", 0, 1, False)
    queue.credit("b", 0, 1, False)
    dispatches = queue.detach("a", [])
    assert [(k, m.seq, m.delivery_count) for k, m in dispatches] == [("b", 0, 1)]


def test_purge_drops_available_messages_only() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    for i in range(3):
        queue.enqueue(Message(_payload(i)))
    queue.credit("c", 0, 1, False)
    assert queue.purge() == 2
    stats = queue.statistics()
    assert (stats.ready, stats.unacked, stats.ready_bytes) == (0, 1, 0)


def test_ready_bytes_count_returned_messages() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    queue.enqueue(Message(b"12345"))
    queue.enqueue(Message(b"123"))
    assert queue.statistics().ready_bytes == 8
    queue.credit("c", 0, 1, False)
    assert queue.statistics().ready_bytes == 3
    queue.settle("c", [0], Outcome.RELEASED, False)
    assert queue.statistics().ready_bytes == 8


def test_statistics_read_no_unacked_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue's statistics cost a step per consumer, not per delivery held: the budget weighs
    queues by them once a run of another worker's publishes while blocked (gateway/peers.py),
    and a consumer holding every message the budget allows made each weighing a pass over
    them all."""
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    for i in range(1_000):
        queue.enqueue(Message(_payload(i)))
    delivered, _ = queue.credit("c", 0, 1_000, False)
    queue.settle("c", [m.seq for m in delivered[:10]], Outcome.ACCEPTED, False)
    expected = sum(m.held for m in delivered[10:])
    reads = 0

    def counted(message: Message) -> int:
        nonlocal reads
        reads += 1
        return len(message.payload)

    monkeypatch.setattr(Message, "held", property(counted))
    stats = queue.statistics()
    assert (stats.unacked, stats.unacked_bytes, reads) == (990, expected, 0)


def test_acknowledged_counts_each_consumed_message_once() -> None:
    queue = ClassicQueue("q")
    queue.attach("a", ack_required=False)
    queue.enqueue(Message(b"x"))
    delivered, _ = queue.credit("a", 0, 1, False)
    queue.detach("a", delivered)
    queue.attach("b", ack_required=False)
    queue.credit("b", 0, 1, False)
    stats = queue.statistics()
    assert (stats.published, stats.acknowledged, stats.delivered) == (1, 1, 1)


_MALFORMED_HEADER = b"\x00\x53\x70\xa1\x01x"  # a header section that is a string, not a list


def test_a_malformed_header_is_refused_before_it_is_stored() -> None:
    # The publish path reads the envelope first: such a message never reaches a queue.
    with pytest.raises(DecodeError):
        read_envelope(_MALFORMED_HEADER)


def test_modified_failed_with_a_malformed_header_keeps_the_message() -> None:
    # Exception safety even so: the message is back in the queue before its header is touched.
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    queue.enqueue(Message(_MALFORMED_HEADER))
    queue.credit("c", 0, 1, False)
    with pytest.raises(DecodeError):
        queue.settle("c", [0], Outcome.MODIFIED, True)
    stats = queue.statistics()
    assert (stats.ready, stats.unacked) == (1, 0)


def test_detach_with_a_malformed_header_keeps_every_message() -> None:
    queue = ClassicQueue("q")
    queue.attach("c", ack_required=True)
    queue.enqueue(Message(_MALFORMED_HEADER))
    queue.enqueue(Message(_payload(1)))
    queue.credit("c", 0, 2, False)
    with pytest.raises(DecodeError):
        queue.detach("c", [])
    stats = queue.statistics()
    assert (stats.ready, stats.consumers) == (2, 0)
    # The well-formed one counted its failed delivery.
    queue.attach("d", ack_required=True)
    delivered, _ = queue.credit("d", 0, 2, False)
    assert [m.delivery_count for m in delivered] == [0, 1]


# -- scale: the scavenger keeps the log to what is live, however long the queue ------------


@pytest.mark.slow
def test_a_million_messages_with_ten_percent_releases() -> None:
    total = 1_000_000
    batch = 1000
    queue = ClassicQueue("big")
    queue.attach("c", ack_required=True)
    payload = b"p"
    for _ in range(total):
        queue.enqueue(Message(payload))
    assert queue.available == total

    delivery_count = 0
    deliveries = 0
    releases = 0
    credit_calls = 0
    archived = 0
    next_fresh = 0  # the lowest sequence number never delivered yet
    while queue.available:
        # Drain, so that no credit is left over for released messages to use at once.
        delivered, reply = queue.credit("c", delivery_count, batch, True)
        credit_calls += 1
        assert reply.delivery_count == serial_add(delivery_count, batch)
        delivery_count = reply.delivery_count
        deliveries += len(delivered)
        seqs = [m.seq for m in delivered]
        assert seqs == sorted(seqs)
        # Released messages come back first; the rest continue the FIFO without gaps.
        fresh = [s for s in seqs if s >= next_fresh]
        assert fresh == list(range(next_fresh, next_fresh + len(fresh)))
        next_fresh += len(fresh)
        # Release every tenth delivery (a lone last message is accepted, or it would bounce).
        release = seqs[::10] if len(seqs) > 1 else []
        accept = [s for i, s in enumerate(seqs) if i % 10 or len(seqs) == 1]
        releases += len(release)
        archived += len(accept)
        assert queue.settle("c", accept, Outcome.ACCEPTED, False) == []
        assert queue.settle("c", release, Outcome.RELEASED, False) == []
        # The scavenger: the log holds what is still queued plus at most a batch of holes
        # (or the compaction threshold), never the archived past.
        assert queue.log_slots() <= queue.available + batch + 4096
    stats = queue.statistics()
    assert archived == total == stats.acknowledged
    assert stats.ready == stats.unacked == 0
    assert queue.log_slots() == 0
    assert deliveries == total + releases
    # Full batches all the way but for a short tail.
    assert credit_calls <= deliveries // batch + 5


# -- the model -----------------------------------------------------------------------------


@dataclass
class ConsumerModel:
    key: int
    ack_required: bool
    delivery_count: int = 0
    credit: int = 0
    unacked: set[int] = field(default_factory=set)
    # Settled-mode deliveries the session could still hand back as unsent on detach.
    settled_delivered: list[int] = field(default_factory=list)


@dataclass
class MessageModel:
    message: Message
    state: str = "ready"  # ready | unacked | archived
    owner: int | None = None
    delivery_count: int = 0
    priority: int = 0


credit_amounts = st.one_of(
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=7, max_value=40),
    st.just(2_000_000_000),
)


class ClassicQueueMachine(RuleBasedStateMachine):
    """A model of :class:`ClassicQueue` with several consumers in both settle modes."""

    consumers = Bundle("consumers")
    # Set by the priority variant: messages then carry priorities 0 to 4 in their headers.
    max_priority: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.queue = ClassicQueue("model", QueueArguments(max_priority=self.max_priority))
        self.messages: dict[int, MessageModel] = {}
        self.models: dict[int, ConsumerModel] = {}
        self.next_key = 0
        self.enqueued = 0

    # -- helpers --

    def ready(self) -> list[int]:
        """Ready sequence numbers in the order the queue serves them: by priority, then age."""
        ready = [s for s, m in self.messages.items() if m.state == "ready"]
        return sorted(ready, key=lambda s: (-self.messages[s].priority, s))

    def hand_out(self, key: ConsumerKey, message: Message) -> None:
        """A message left the queue for a consumer: check it against the model and record it."""
        assert isinstance(key, int)
        consumer = self.models[key]
        model = self.messages[message.seq]
        assert model.message is message
        # Never delivered twice: it must be ready, and the lowest ready (served in seq order).
        assert model.state == "ready", f"seq {message.seq} handed out while {model.state}"
        assert message.seq == self.ready()[0]
        # Never more than the consumer's credit.
        assert consumer.credit > 0
        consumer.credit -= 1
        consumer.delivery_count = serial_add(consumer.delivery_count, 1)
        assert message.delivery_count == model.delivery_count
        assert read_header(message.read()).delivery_count == model.delivery_count
        if consumer.ack_required:
            model.state, model.owner = "unacked", key
            consumer.unacked.add(message.seq)
        else:
            model.state, model.owner = "archived", None
            consumer.settled_delivered.append(message.seq)

    def dispatched(self, dispatches: list[Dispatch]) -> None:
        for key, message in dispatches:
            self.hand_out(key, message)

    def requeue(self, seq: int, failed: bool) -> None:
        model = self.messages[seq]
        model.state, model.owner = "ready", None
        if failed:
            model.delivery_count += 1

    # -- rules --

    @initialize(target=consumers, ack_required=st.booleans())
    def first_consumer(self, ack_required: bool) -> int:
        return self._attach(ack_required)

    @rule(target=consumers, ack_required=st.booleans())
    def attach(self, ack_required: bool) -> int:
        return self._attach(ack_required)

    def _attach(self, ack_required: bool) -> int:
        key = self.next_key
        self.next_key += 1
        self.queue.attach(key, ack_required=ack_required)
        self.models[key] = ConsumerModel(key, ack_required)
        return key

    @rule(count=st.integers(min_value=1, max_value=5))
    def enqueue(self, count: int) -> None:
        for _ in range(count):
            payload = _payload(self.enqueued)
            priority = 0
            if self.max_priority is not None:
                # Above x-max-priority counts as x-max-priority, as in RabbitMQ.
                priority = min(self.enqueued % 5, self.max_priority)
                payload = encode_header(Header(priority=self.enqueued % 5)) + payload
            message = Message(payload)
            self.enqueued += 1
            # Register the message before the queue decides where it goes: sequence numbers
            # count publications from 0.
            seq = self.queue.statistics().published
            self.messages[seq] = MessageModel(message, priority=priority)
            self.dispatched(self.queue.enqueue(message))
            # A paged message gets its sequence number when it is paged in: the same one.
            assert message.seq == seq or self.queue.pager is not None

    @rule(key=consumers, credit=credit_amounts, drain=st.booleans())
    def credit(self, key: int, credit: int, drain: bool) -> None:
        consumer = self.models.get(key)
        if consumer is None:
            return
        ready_before = len(self.ready())
        consumer.credit = credit
        dc_before = consumer.delivery_count
        delivered, reply = self.queue.credit(key, consumer.delivery_count, credit, drain)
        assert len(delivered) == min(credit, ready_before)
        for message in delivered:
            self.hand_out(key, message)
        if drain:
            consumer.delivery_count = serial_add(dc_before, credit)
            consumer.credit = 0
        assert reply == CreditReply(
            consumer.delivery_count, consumer.credit, len(self.ready()), drain
        )

    @rule(
        key=consumers,
        data=st.data(),
        outcome=st.sampled_from(Outcome),
        delivery_failed=st.booleans(),
    )
    def settle(
        self, key: int, data: st.DataObject, outcome: Outcome, delivery_failed: bool
    ) -> None:
        consumer = self.models.get(key)
        if consumer is None or not consumer.unacked:
            return
        # delivery-failed is a field of the modified outcome only (AMQP 1.0 §3.4.5).
        delivery_failed = delivery_failed and outcome is Outcome.MODIFIED
        seqs = data.draw(st.lists(st.sampled_from(sorted(consumer.unacked)), unique=True))
        # Some noise: a sequence number this consumer does not hold is ignored.
        stranger = data.draw(st.sampled_from([*sorted(self.messages), len(self.messages)]))
        noise = [] if stranger in consumer.unacked else [stranger]
        for seq in seqs:
            consumer.unacked.discard(seq)
            if outcome in (Outcome.ACCEPTED, Outcome.REJECTED):
                self.messages[seq].state = "archived"
                self.messages[seq].owner = None
            else:
                self.requeue(seq, outcome is Outcome.MODIFIED and delivery_failed)
        self.dispatched(self.queue.settle(key, seqs + noise, outcome, delivery_failed))

    @rule(key=consumes(consumers), data=st.data())
    def detach(self, key: int, data: st.DataObject) -> None:
        consumer = self.models.pop(key, None)
        if consumer is None:
            return
        if consumer.ack_required:
            candidates = sorted(consumer.unacked)
        else:
            # Settled-mode deliveries the session had not sent yet (it passes them back).
            candidates = consumer.settled_delivered[-5:]
        unsent_seqs = (
            data.draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
        )
        for seq in unsent_seqs:
            self.requeue(seq, failed=False)
        for seq in consumer.unacked - set(unsent_seqs):
            self.requeue(seq, failed=True)
        unsent = [self.messages[s].message for s in unsent_seqs]
        self.dispatched(self.queue.detach(key, unsent))

    # -- invariants --

    @invariant()
    def nothing_lost(self) -> None:
        states = {"ready": 0, "unacked": 0, "archived": 0}
        for model in self.messages.values():
            states[model.state] += 1
        assert sum(states.values()) == self.enqueued
        stats = self.queue.statistics()
        assert stats.published == self.enqueued
        assert self.queue.available == stats.ready == states["ready"]
        assert stats.unacked == states["unacked"]
        # Kept as deliveries come and go, not summed over them.
        assert stats.unacked_bytes == sum(
            model.message.held for model in self.messages.values() if model.state == "unacked"
        )
        assert stats.consumers == len(self.models)
        # Each unacked message is held by exactly the consumer the model says.
        for key, consumer in self.models.items():
            assert _holds(self.queue, key) == consumer.unacked
            for seq in consumer.unacked:
                assert self.messages[seq].owner == key

    @invariant()
    def no_consumer_with_credit_while_messages_wait(self) -> None:
        if self.queue.available:
            assert all(c.credit == 0 for c in self.models.values())

    @invariant()
    def delivery_counts_in_serial_space(self) -> None:
        for consumer in self.models.values():
            assert 0 <= consumer.delivery_count <= SERIAL_MASK


ClassicQueueMachine.TestCase.settings = settings(stateful_step_count=40)
test_classic_queue_model = ClassicQueueMachine.TestCase


class _MemoryPager:
    def append(self, tail: Page | None, message: Message) -> Page | None:
        return append_in_memory(tail, message)


class PagingClassicQueueMachine(ClassicQueueMachine):
    """The same model over a queue that keeps two ready messages resident and pages the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.queue.pager = _MemoryPager()
        self.queue.resident_ready = 2

    @invariant()
    def held_bytes_match_the_messages_in_the_queue(self) -> None:
        """Paged in memory or resident, each message counts its bytes and overhead once."""
        present = [m.message for m in self.messages.values() if m.state != "archived"]
        expected = sum(m.held + MESSAGE_OVERHEAD for m in present)
        assert self.queue.held.total == expected


PagingClassicQueueMachine.TestCase.settings = settings(stateful_step_count=40)
test_paging_classic_queue_model = PagingClassicQueueMachine.TestCase


class PriorityClassicQueueMachine(ClassicQueueMachine):
    """The same model over a priority queue: highest priority first, oldest first within it."""

    max_priority = 2


PriorityClassicQueueMachine.TestCase.settings = settings(stateful_step_count=40)
test_priority_classic_queue_model = PriorityClassicQueueMachine.TestCase
