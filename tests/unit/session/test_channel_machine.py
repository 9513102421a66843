"""Consumers in one worker, a classic queue in another, the channel's bytes in between in pieces
of any size, in any interleaving: the bounds of the local session <- queue protocol hold across
it (issue 35). The machine plays the session side (FLOWs with any credit, drain and echo, the
deliveries it hands to clients, settlements, detaches), the publishers on the owner's side and
the network in both directions. After every step: at most one credit request in flight per
consumer, a later FLOW stashed while one is out, the queue never sent more than the latest
request granted; once the channel is quiet, every message is in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from support.examples import examples

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import QueueType
from sluicegate.session.channel.codec import FrameReader, encode
from sluicegate.session.channel.ends import SessionEnd
from sluicegate.session.channel.frames import (
    Attach,
    Attached,
    Credit,
    CreditReply,
    Deliveries,
    Detach,
    Frame,
    Letters,
    Settle,
    Settled,
    ranges_of,
)
from sluicegate.session.channel.owner import Owner

MAX_QUEUE_CREDIT = 8
MAX_FRAME = 64 * 1024
# Which attached consumer a rule acts on: an index into them, wrapping around.
CONSUMERS = st.integers(0, 2)


@dataclass
class Consumer:
    """A consumer as the session side's model sees it."""

    end: SessionEnd
    ack_required: bool
    # Requests sent and replies received: their difference is what is in flight.
    requests: int = 0
    replies: int = 0
    # What the queue may still send since the latest request or reply, and what it sent since.
    limit: int = 0
    received: int = 0
    # Received and not yet handed to the client; handed and not yet settled.
    waiting: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = ClassicQueue("q")
        queues: dict[tuple[str, str], QueueType] = {("/", "q"): self.queue}
        self.owner = Owner(lambda vhost, name: queues.get((vhost, name)), MAX_QUEUE_CREDIT)
        self.to_owner = bytearray()
        self.to_session = bytearray()
        self.owner_reader = FrameReader(MAX_FRAME)
        self.session_reader = FrameReader(MAX_FRAME)
        self.consumers: dict[int, Consumer] = {}
        self.next_consumer = 1
        self.next_seq = 0
        # Where every message went, for the count once the channel is quiet.
        self.published = 0
        self.gone = 0

    # -- the session side -----------------------------------------------------------------

    def _to_owner(self, frame: Frame) -> None:
        for piece in encode(frame):
            self.to_owner += piece

    def _pick(self, number: int) -> Consumer | None:
        if not self.consumers:
            return None
        return list(self.consumers.values())[number % len(self.consumers)]

    def _request(self, consumer: Consumer, request: Credit | None) -> None:
        if request is None:
            return
        consumer.requests += 1
        # Deliveries on the credit the queue held may cross the request; the queue counts
        # them against the new credit, from the request's delivery-count (which lags the one
        # seen by the deliveries still waiting in the session).
        lag = consumer.end.delivery_count - request.delivery_count
        consumer.limit = max(consumer.limit - consumer.received, max(0, request.credit - lag))
        consumer.received = 0
        self._to_owner(request)

    @initialize(ack_required=st.booleans())
    def first_consumer(self, ack_required: bool) -> None:
        self.attach(ack_required)

    @precondition(lambda self: len(self.consumers) < 3)
    @rule(ack_required=st.booleans())
    def attach(self, ack_required: bool) -> None:
        number = self.next_consumer
        self.next_consumer += 1
        self.consumers[number] = Consumer(SessionEnd(number), ack_required)
        self._to_owner(Attach(number, "/", "q", ack_required, False, 0))

    @precondition(lambda self: self.consumers)
    @rule(
        number=CONSUMERS,
        credit=st.integers(0, 3 * MAX_QUEUE_CREDIT),
        drain=st.booleans(),
        echo=st.booleans(),
        lagging=st.booleans(),
    )
    def flow(self, number: int, credit: int, drain: bool, echo: bool, lagging: bool) -> None:
        consumer = self._pick(number)
        if consumer is None:
            return
        end = consumer.end
        was_in_flight = end.in_flight
        # As a session asks: counted from what it sent on, behind what still waits in it.
        counted = end.delivery_count - len(consumer.waiting) if lagging else None
        wanted = min(credit, MAX_QUEUE_CREDIT)
        request = end.request(wanted, drain, echo, counted)
        if was_in_flight:
            assert request is None
            assert end.stashed == (wanted, drain, echo, counted)
        self._request(consumer, request)

    @precondition(lambda self: any(c.waiting for c in self.consumers.values()))
    @rule(number=CONSUMERS, count=st.integers(1, 5))
    def hand_to_client(self, number: int, count: int) -> None:
        consumer = self._pick(number)
        if consumer is None:
            return
        handed, consumer.waiting = consumer.waiting[:count], consumer.waiting[count:]
        if consumer.ack_required:
            consumer.held.extend(handed)
        else:
            self.gone += len(handed)

    @precondition(lambda self: any(c.held for c in self.consumers.values()))
    @rule(number=CONSUMERS, outcome=st.sampled_from(Settled), data=st.data())
    def settle(self, number: int, outcome: Settled, data: st.DataObject) -> None:
        consumer = self._pick(number)
        if consumer is None or not consumer.held:
            return
        chosen = data.draw(st.sets(st.sampled_from(consumer.held), min_size=1))
        consumer.held = [seq for seq in consumer.held if seq not in chosen]
        if outcome in (Settled.ACCEPTED, Settled.REJECTED):
            self.gone += len(chosen)
        self._to_owner(Settle(consumer.end.consumer, outcome, ranges_of(list(chosen))))

    @precondition(lambda self: self.consumers)
    @rule(number=CONSUMERS)
    def detach(self, number: int) -> None:
        consumer = self._pick(number)
        if consumer is None:
            return
        name = consumer.end.consumer
        del self.consumers[name]
        self._to_owner(Detach(name, consumer.end.delivery_count, tuple(consumer.waiting)))

    @precondition(lambda self: self.to_session)
    @rule(cut=st.integers(1, 400))
    def session_reads(self, cut: int) -> None:
        data = bytes(self.to_session[:cut])
        del self.to_session[:cut]
        for frame in self.session_reader.feed(data):
            if isinstance(frame, Attached):
                # The owner took a consumer: a session answers its client's ATTACH.
                event("attach taken")
                continue
            if isinstance(frame, Letters):
                # What a consumer's rejections owe in dead letters, live or detached (this
                # machine's queue has no dead-letter exchange, so nothing is owed).
                assert frame.owed == 0, frame
                event("letters reported")
                continue
            number = frame.consumer if isinstance(frame, Deliveries | CreditReply) else -1
            consumer = self.consumers.get(number)
            if consumer is None:
                # A detached consumer's frames that crossed its DETACH: the owner takes its
                # deliveries back as unsent.
                assert isinstance(frame, Deliveries | CreditReply), frame
                continue
            if isinstance(frame, Deliveries):
                consumer.end.delivered(len(frame.seqs))
                consumer.received += len(frame.seqs)
                consumer.waiting.extend(frame.seqs)
                event("deliveries crossed")
            else:
                assert isinstance(frame, CreditReply)
                consumer.replies += 1
                consumer.limit = frame.credit
                consumer.received = 0
                self._request(consumer, consumer.end.replied(frame))

    # -- the owner side -------------------------------------------------------------------

    def _to_session(self, frames: list[Frame]) -> None:
        for frame in frames:
            for piece in encode(frame):
                self.to_session += piece

    @rule(count=st.integers(1, 6))
    def publish(self, count: int) -> None:
        for _ in range(count):
            self.published += 1
            frames, local = self.owner.route(self.queue.enqueue(Message(b"m" * 20)))
            assert local == []
            self._to_session(frames)

    @precondition(lambda self: self.to_owner)
    @rule(cut=st.integers(1, 400))
    def owner_reads(self, cut: int) -> None:
        data = bytes(self.to_owner[:cut])
        del self.to_owner[:cut]
        for frame in self.owner_reader.feed(data):
            frames, local = self.owner.receive(frame)
            assert local == []
            self._to_session(frames)

    # -- the bounds -----------------------------------------------------------------------

    @invariant()
    def one_request_in_flight_and_flows_stashed_meanwhile(self) -> None:
        for consumer in self.consumers.values():
            assert consumer.requests - consumer.replies in (0, 1)
            assert consumer.end.in_flight == (consumer.requests > consumer.replies)
            if consumer.end.stashed is not None:
                assert consumer.end.in_flight

    @invariant()
    def the_queue_sends_no_more_than_the_latest_request_granted(self) -> None:
        for consumer in self.consumers.values():
            assert consumer.received <= consumer.limit <= MAX_QUEUE_CREDIT

    @invariant()
    def every_message_is_in_one_place_once_the_channel_is_quiet(self) -> None:
        if self.to_owner or self.to_session:
            return
        statistics = self.queue.statistics()
        in_session = sum(len(c.waiting) for c in self.consumers.values())
        held = sum(len(c.held) for c in self.consumers.values() if c.ack_required)
        unacked_waiting = sum(len(c.waiting) for c in self.consumers.values() if c.ack_required)
        assert statistics.unacked == held + unacked_waiting
        assert self.published == statistics.ready + in_session + held + self.gone

    @invariant()
    def the_readers_hold_at_most_an_unfinished_frame(self) -> None:
        assert self.owner_reader.buffered < MAX_FRAME
        assert self.session_reader.buffered < MAX_FRAME


ChannelMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=60, deadline=None
)
TestChannel = ChannelMachine.TestCase
