"""A session consuming a queue of another worker through both ends of the channel, in memory:
a real Session and RemoteQueue on one side, an Owner and ClassicQueue on the other, every
frame encoded and read back (docs/workers.md). What the client sees must be what it sees of a
local queue, whatever the client's credit and however the frames are held up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Dispatch, Outcome
from sluicegate.session.channel.codec import FrameReader, encode
from sluicegate.session.channel.frames import (
    Attached,
    Confirm,
    Credit,
    CreditReply,
    Deliveries,
    Error,
    Frame,
    Publish,
    Settled,
    Short,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.remote import Remote, RemoteQueue, WorkerDown
from sluicegate.session.outbound import LinkFlow, Session, resume, route
from sluicegate.session.waiting import IMPORT_BATCH
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp
from sluicegate.wire.sections import DEFAULT_HEADER
from sluicegate.writer.writer import Writer

MAX_FRAME = 1 << 20


class Pair:
    """Worker A's session and worker B's queue, joined by the channel's two byte streams."""

    def __init__(self, ack_required: bool = False, max_import_credit: int = 16) -> None:
        self.queue = ClassicQueue("q")
        self.remote = Remote(1)
        self.remote.opened()
        self.owner = Owner(lambda vhost, name: self.queue if name == "q" else None, 16)
        self.to_owner = FrameReader(MAX_FRAME)
        self.to_session = FrameReader(MAX_FRAME)
        self.writer = Writer()
        self.session = Session(
            self.writer,
            remote_incoming_window=1 << 20,
            max_queue_credit=16,
            max_import_credit=max_import_credit,
        )
        self.link = self.session.attach_link(
            0, RemoteQueue("q", "/", self.remote), ack_required=ack_required
        )
        self.received: list[Message] = []
        # The consumers the owner refused, as the gateway would detach them.
        self.refused: list[tuple[object, Error]] = []
        self.flows: list[LinkFlow] = []
        self.client_dc = 0
        # Frames each way not yet delivered: the test decides when they cross.
        self.in_flight_up: list[bytes] = []
        self.in_flight_down: list[bytes] = []

    def publish(self, count: int, start: int = 0) -> None:
        for n in range(start, start + count):
            self._local(self.queue.enqueue(Message(amqp(Described(0x77, f"m{n}")))))

    def _local(self, dispatches: list[Dispatch]) -> None:
        # What the owner's queue hands its remote consumers waits in the outbox.
        route(dispatches)

    def up(self) -> None:
        """Frames the session's side wrote cross to the owner."""
        for frame in self.remote.outgoing:
            self.in_flight_up.extend(encode(frame))
        self.remote.outgoing.clear()

    def deliver_up(self) -> None:
        data = b"".join(self.in_flight_up)
        self.in_flight_up.clear()
        for frame in self.to_owner.feed(data):
            frames, local = self.owner.receive(frame)
            self._local(local)
            self._down(frames)
        self._down(self.owner.flush())

    def _down(self, frames: list[Frame]) -> None:
        for frame in frames:
            self.in_flight_down.extend(encode(frame))

    def deliver_down(self) -> None:
        data = b"".join(self.in_flight_down)
        self.in_flight_down.clear()
        for frame in self.to_session.feed(data):
            if type(frame) is Deliveries:
                delivered = self.remote.delivered(frame)
                if delivered is not None:
                    self.session.deliver_all(self.link, delivered[1])
            elif type(frame) is Attached:
                # The owner took the consumer: the gateway answers the client's ATTACH now.
                assert self.remote.attached(frame) in (self.link, None)
            elif type(frame) is CreditReply:
                # None for a consumer detached since: nobody waits for the reply.
                replied = self.remote.replied(frame)
                if replied is not None:
                    self.session.credit_replied(self.link, replied[1])
            elif type(frame) is Short:
                shorted = self.remote.shorted(frame)
                if shorted is not None:
                    self.session.shorted(self.link, shorted[1])
            elif type(frame) is Error:
                key = self.remote.refused(frame)
                if key is not None:
                    # The gateway refuses the client's ATTACH with the owner's condition and
                    # detaches the link (gateway/links.py refuse_consumer).
                    self.refused.append((key, frame))
                    route(self.session.detach_link(self.link))
            else:
                raise AssertionError(frame)

    def pump(self) -> None:
        for action in self.session.send_pending():
            if isinstance(action, LinkFlow):
                self.flows.append(action)
                if action.drain:
                    self.client_dc = action.delivery_count
            else:
                self.received.append(action[1])  # type: ignore[index]
                self.client_dc += 1
        self.writer.caught_up(0)

    def settle_all(self) -> None:
        for _ in range(50):
            self.up()
            self.deliver_up()
            self.deliver_down()
            self.pump()
            if not (self.remote.outgoing or self.in_flight_up or self.in_flight_down):
                self.pump()
                if not self.remote.outgoing:
                    return


def bodies(messages: list[Message]) -> list[bytes]:
    return [message.payload for message in messages]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 60),
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
    st.booleans(),
)
def test_every_message_arrives_once_in_order_and_never_beyond_the_clients_credit(
    count: int, grants: list[int], ack_required: bool
) -> None:
    pair = Pair(ack_required)
    pair.publish(count)
    granted = settled = 0
    for grant in grants:
        pair.session.client_flow(pair.link, pair.client_dc, grant, False, False)
        granted = len(pair.received) + grant
        pair.settle_all()
        assert len(pair.received) <= granted
        if ack_required and len(pair.received) > settled:
            seqs = [message.seq for message in pair.received[settled:]]
            settled = len(pair.received)
            pair.session.settle(pair.link, seqs, Outcome.ACCEPTED, False)
    expected = [amqp(Described(0x77, f"m{n}")) for n in range(count)]
    assert bodies(pair.received) == expected[: min(count, granted)]


def test_a_drain_on_an_empty_remote_queue_is_answered_with_its_credit_spent() -> None:
    pair = Pair()
    pair.publish(3)
    pair.session.client_flow(pair.link, 0, 10, True, False)
    pair.settle_all()
    assert len(pair.received) == 3
    assert pair.flows
    assert pair.flows[-1].drain
    assert pair.flows[-1].delivery_count == 10
    assert pair.flows[-1].link_credit == 0


def test_deliveries_that_crossed_a_detach_go_back_to_the_queue_as_they_were() -> None:
    pair = Pair()
    pair.publish(5)
    pair.session.client_flow(pair.link, 0, 5, False, False)
    pair.up()
    pair.deliver_up()
    # The owner's deliveries are on their way; the session detaches before they arrive.
    pair.session.detach_link(pair.link)
    pair.up()
    pair.deliver_down()
    pair.deliver_up()
    assert pair.received == []
    assert pair.queue.statistics().ready == 5


def test_a_publish_is_confirmed_by_id_and_lost_ones_come_back_to_be_released() -> None:
    remote = Remote(1)
    queue = RemoteQueue("q", "/", remote)
    message = Message(b"x", routing_key="q")
    assert not queue.publish("down", message)
    remote.opened()
    assert queue.publish("first", message)
    assert queue.publish("second", message)
    # One frame for the run, ids 1 and 2.
    (sent,) = [frame for frame in remote.outgoing if type(frame) is Publish]
    assert (sent.publish, sent.payloads) == (1, [b"x", b"x"])
    assert remote.confirmed(Confirm(1, 1, Settled.ACCEPTED)) == ["first"]
    assert remote.lost() == ([], ["second"])


def test_what_was_sent_is_counted_by_queue_until_its_owner_confirms_or_the_channel_ends() -> None:
    # The sender's budget counts it (adversary seed 65401): the owner parks it uncounted.
    remote = Remote(1)
    remote.opened()
    here, there = RemoteQueue("q", "/", remote), RemoteQueue("r", "/", remote)
    assert here.publish("a", Message(b"x" * 100, routing_key="q"))
    assert there.publish(None, Message(b"y" * 50, routing_key="r"))
    assert here.publish("b", Message(b"z" * 10, routing_key="q"))
    assert (here.in_flight(), there.in_flight()) == (
        110 + 2 * MESSAGE_OVERHEAD,
        50 + MESSAGE_OVERHEAD,
    )
    assert remote.in_flight == 160 + 3 * MESSAGE_OVERHEAD
    assert remote.confirmed(Confirm(1, 2, Settled.ACCEPTED)) == ["a", None]
    assert (here.in_flight(), there.in_flight()) == (10 + MESSAGE_OVERHEAD, 0)
    assert remote.in_flight_to == {("/", "q"): 10 + MESSAGE_OVERHEAD}
    remote.lost()
    assert (remote.in_flight, remote.in_flight_to, remote.sent_sizes) == (0, {}, {})


def test_publishes_share_a_frame_only_while_it_is_unsent_to_one_queue_and_within_the_limit() -> (
    None
):
    remote = Remote(1, max_filter_set_size=100)
    remote.opened()
    here, there = RemoteQueue("q", "/", remote), RemoteQueue("r", "/", remote)
    small, large = Message(b"s" * 10, routing_key="a"), Message(b"l" * 60, routing_key="a")
    for queue, message in [(here, small), (here, small), (there, small), (here, small)]:
        assert queue.publish(None, message)
    assert here.publish(None, Message(b"s" * 10, routing_key="b"))
    assert here.publish(None, large)
    # Over the 100 bytes (payloads and their stamps) a frame may carry.
    assert here.publish(None, large)
    frames = [frame for frame in remote.outgoing if type(frame) is Publish]
    runs = [(f.publish, f.queue, f.routing_key, len(f.payloads)) for f in frames]
    assert runs == [(1, "q", "a", 2), (3, "r", "a", 1), (4, "q", "a", 1), (5, "q", "b", 1),
                    (6, "q", "a", 1), (7, "q", "a", 1)]  # fmt: skip
    assert frames[0].stamps == [(None, DEFAULT_HEADER, 0)] * 2
    # Once the flush took them, a publish starts a frame of its own.
    remote.outgoing.clear()
    assert here.publish(None, large)
    (alone,) = remote.outgoing
    assert isinstance(alone, Publish)
    assert alone.publish == 8


def test_an_attach_while_the_home_worker_is_down_is_refused_cleanly() -> None:
    remote = Remote(1)
    queue = RemoteQueue("q", "/", remote)
    with pytest.raises(WorkerDown) as refused:
        queue.attach("consumer", ack_required=True)
    assert refused.value.condition == "amqp:resource-deleted"


def test_an_owners_refusal_names_the_consumer_to_detach_once() -> None:
    remote = Remote(1)
    remote.opened()
    queue = RemoteQueue("q", "/", remote)
    queue.attach("consumer", ack_required=True)
    assert remote.refused(Error(1, "amqp:not-found", "gone")) == "consumer"
    assert remote.refused(Error(1, "amqp:not-found", "gone")) is None


def test_an_attach_the_owner_refuses_leaves_nothing_on_either_side() -> None:
    """The queue went on its owner between the stand-in's check and the owner's (docs/workers.md):
    the owner's ATTACH refusal is the session's, once, and nothing of the consumer remains."""
    pair = Pair(ack_required=True)
    pair.publish(3)
    # The ATTACH waits in the frames to the owner (the client's credit counts only once the
    # owner took it: gateway/links.py, owner_took).
    pair.up()
    # The owner no longer has the queue when the ATTACH reaches it.
    gone = pair.queue
    pair.owner.find = lambda vhost, name: None
    pair.deliver_up()
    assert pair.owner.consumers == {}
    assert pair.owner.consumers_of(gone) == 0
    assert gone.statistics().consumers == 0
    pair.deliver_down()
    ((key, error),) = pair.refused
    assert key is pair.link
    assert (error.condition, error.description) == ("amqp:not-found", "no queue 'q' in vhost '/'")
    # The consumer is gone from the session's side: nothing more crosses for it, and what the
    # owner's queue holds stays there.
    assert pair.remote.consumers == {}
    pair.settle_all()
    assert pair.received == []
    assert pair.remote.outgoing == []
    assert gone.statistics().ready == 3


def _credit_requests(pair: Pair) -> list[Credit]:
    return [frame for frame in pair.remote.outgoing if type(frame) is Credit]


def _send(pair: Pair, count: int) -> None:
    """The client's window lets ``count`` transfers go."""
    pair.session.remote_incoming_window = count
    pair.pump()


def test_the_next_batch_is_asked_before_the_last_has_left_and_only_then() -> None:
    pair = Pair()
    pair.publish(100)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    # The first request asks for one delivery, the next, its size known, for the batch,
    # counted from what has left the session (none yet): 16 in all.
    for _ in range(2):
        pair.up()
        pair.deliver_up()
        pair.deliver_down()
    # A batch of 16 waits in the session; the reply came with it and is taken at once.
    assert len(pair.link.waiting) == 16
    assert pair.session.statistics().credit_requests_in_flight == 0
    below = pair.link.top_up_below
    assert 0 < below < 16
    _send(pair, 16 - below)
    assert _credit_requests(pair) == []
    # One more leaves fewer than ``below`` of the batch: the next request goes now, counted
    # from what has left, so the deliveries still waiting count against it.
    _send(pair, 1)
    (request,) = _credit_requests(pair)
    assert (request.delivery_count, request.credit) == (17 - below, 16)
    assert len(pair.link.waiting) == below - 1
    assert pair.session.statistics().credit_requests_in_flight == 1
    # While it is out, no other request goes however much leaves.
    _send(pair, below - 1)
    assert _credit_requests(pair) == [request]
    pair.up()
    pair.deliver_up()
    pair.deliver_down()
    # The queue sent what the request left it room for: 16 from where it was counted, less
    # what it had sent before.
    assert len(pair.received) == 16
    assert len(pair.link.waiting) == 17 - below


def test_a_batch_that_leaves_at_once_is_followed_by_a_whole_batch() -> None:
    pair = Pair()
    pair.publish(100)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    for _ in range(2):
        pair.up()
        pair.deliver_up()
        pair.deliver_down()
    assert len(pair.link.waiting) == 16
    # The window lets the whole batch go in one send_pending: the next request is made once
    # it has left, not as it ran low, so it brings a whole batch, not what a quarter left.
    _send(pair, 16)
    (request,) = _credit_requests(pair)
    assert (request.delivery_count, request.credit) == (16, 16)
    assert pair.session.statistics().credit_requests_in_flight == 1
    pair.up()
    pair.deliver_up()
    pair.deliver_down()
    assert len(pair.link.waiting) == 16


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from([None, "drain", "echo", "grant"])),
        min_size=1,
        max_size=40,
    ),
    st.booleans(),
)
def test_a_pipelined_consumer_keeps_one_request_out_and_at_most_a_batch_waiting(
    steps: list[tuple[int, str | None]], ack_required: bool
) -> None:
    pair = Pair(ack_required)
    pair.publish(120)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    # The most the client's FLOWs ever allowed it (delivery-count + credit).
    limit = 100
    out = 0
    asked_early = False
    for window, flow in [*steps, *[(1 << 20, None)] * 16]:
        if flow is not None:
            # A client FLOW mid-stream: a drain, an echo, or more credit, from what it has seen.
            credit = 30 if flow == "grant" else 10
            limit = max(limit, pair.client_dc + credit)
            pair.session.client_flow(
                pair.link, pair.client_dc, credit, flow == "drain", flow == "echo"
            )
        requests = _credit_requests(pair)
        out += len(requests)
        # Counted from what left the session, behind what it has received: asked while
        # deliveries of the last batch still waited.
        seen = pair.remote.consumers[1][1].delivery_count
        asked_early |= any(request.delivery_count != seen for request in requests)
        assert out <= 1
        pair.up()
        pair.deliver_up()
        crossing = FrameReader(MAX_FRAME).feed(b"".join(pair.in_flight_down))
        out -= sum(1 for frame in crossing if type(frame) is CreditReply)
        pair.deliver_down()
        assert len(pair.link.waiting) <= 16
        _send(pair, window)
        assert len(pair.received) <= limit
    expected = [amqp(Described(0x77, f"m{n}")) for n in range(120)]
    assert bodies(pair.received) == expected[: len(pair.received)]
    if all(flow is None for _, flow in steps):
        assert len(pair.received) == 100
        assert asked_early


def test_another_workers_queue_is_asked_for_one_then_a_batch_within_its_bytes() -> None:
    pair = Pair()
    pair.publish(40)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    (first,) = _credit_requests(pair)
    assert first.credit == 1
    pair.up()
    pair.deliver_up()
    pair.deliver_down()
    size = pair.link.largest
    assert size > 0
    (second,) = _credit_requests(pair)
    assert second.credit == min(16, max(1, IMPORT_BATCH // size))


def test_a_larger_import_batch_is_asked_within_the_clients_credit_and_goes_back_whole() -> None:
    # The gateway asks another worker's queue for IMPORT_CREDIT_FACTOR local batches at once
    # (session/outbound.py): here 64 where a local queue is asked for 16.
    pair = Pair(ack_required=True, max_import_credit=64)
    pair.publish(200)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    for _ in range(2):
        pair.up()
        pair.deliver_up()
        pair.deliver_down()
    assert pair.link.batch == 64
    assert len(pair.link.waiting) == 64
    _send(pair, 64)
    # The rest of the client's credit, not another whole batch.
    (request,) = _credit_requests(pair)
    assert (request.delivery_count, request.credit) == (64, 36)
    pair.up()
    pair.deliver_up()
    pair.deliver_down()
    assert len(pair.link.waiting) == 36
    assert len(pair.received) == 64
    # The owner keeps what a batch and the deliveries crossing its next request may be, so
    # a detach gives back every delivery the client never settled, as it was.
    seqs = [message.seq for message in pair.received]
    route(pair.session.settle(pair.link, seqs, Outcome.ACCEPTED, False))
    route(pair.session.detach_link(pair.link))
    pair.up()
    pair.deliver_up()
    assert pair.queue.statistics().ready == 200 - 64
    again = object()
    pair.queue.attach(again, ack_required=True)
    back, _ = pair.queue.credit(again, 0, 200, False)
    assert [message.delivery_count for message in back] == [0] * (200 - 64)


def test_a_larger_import_batch_of_large_messages_stays_within_its_bytes() -> None:
    pair = Pair(max_import_credit=64)
    body = b"x" * (IMPORT_BATCH // 10)
    for _ in range(40):
        pair._local(pair.queue.enqueue(Message(amqp(Described(0x75, body)))))
    pair.session.client_flow(pair.link, 0, 100, False, False)
    for _ in range(2):
        pair.up()
        pair.deliver_up()
        pair.deliver_down()
    assert len(pair.link.waiting) == IMPORT_BATCH // pair.link.largest < 16


def test_with_the_budget_full_nothing_new_is_asked_of_another_worker() -> None:
    pair = Pair()
    pair.publish(40)
    server = pair.session.waiting.server
    server.blocked = server.full = True
    # Full: only a connection holding nothing unsent asks, and this one holds a byte.
    pair.session.waiting.charge(1, 0)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    # Deferred, in flight as far as the client's FLOWs go, and the connection named.
    assert _credit_requests(pair) == []
    assert pair.session.statistics().credit_requests_in_flight == 1
    assert set(server.starved) == {pair.session.waiting}
    assert not pair.session.waiting.resumable
    # Still full: making the deferred requests makes none.
    assert resume(pair.session.waiting) == set()
    server.blocked = server.full = False
    server.starved.clear()
    assert resume(pair.session.waiting) == {pair.session}
    (request,) = _credit_requests(pair)
    assert request.credit == 1
    pair.settle_all()
    assert len(pair.received) == 40


def test_while_the_budget_is_blocked_a_connection_holding_a_batch_asks_nothing_new() -> None:
    # Blocked but not full: a client that reads is served, one that does not stops
    # at a batch's worth waiting (session/waiting.py).
    pair = Pair()
    pair.publish(40)
    waiting = pair.session.waiting
    waiting.server.blocked = True
    pair.session.client_flow(pair.link, 0, 100, False, False)
    assert [request.credit for request in _credit_requests(pair)] == [1]
    pair.settle_all()
    assert len(pair.received) == 40
    # The connection's other links hold a batch's worth the client has not read.
    waiting.charge(IMPORT_BATCH, 0)
    pair.publish(10, start=40)
    pair.session.client_flow(pair.link, pair.client_dc, 100, False, False)
    assert _credit_requests(pair) == []
    assert set(waiting.server.starved) == {waiting}
    held_back = waiting.resumable
    assert not held_back
    # The client reads them: the request goes, the budget still blocked.
    waiting.charge(-IMPORT_BATCH, 0)
    assert waiting.resumable
    assert resume(waiting) == {pair.session}
    pair.settle_all()
    assert len(pair.received) == 50


def test_a_starved_consumer_that_detaches_leaves_nothing_in_the_servers_set() -> None:
    pair = Pair()
    server = pair.session.waiting.server
    server.blocked = server.full = True
    # Full: only a connection holding nothing unsent asks, and this one holds a byte.
    pair.session.waiting.charge(1, 0)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    assert set(server.starved) == {pair.session.waiting}
    route(pair.session.detach_link(pair.link))
    assert not server.starved


def test_a_drain_with_the_budget_full_is_answered_with_nothing_new() -> None:
    pair = Pair()
    pair.publish(40)
    server = pair.session.waiting.server
    server.blocked = server.full = True
    # Full: only a connection holding nothing unsent asks, and this one holds a byte.
    pair.session.waiting.charge(1, 0)
    pair.session.client_flow(pair.link, 0, 100, False, False)
    assert _credit_requests(pair) == []
    # The drain replaces the request that waits for the budget and asks for none.
    pair.session.client_flow(pair.link, 0, 100, True, False)
    (request,) = _credit_requests(pair)
    assert (request.credit, request.drain) == (0, True)
    assert not server.starved
    pair.settle_all()
    assert pair.received == []
    drained = [flow for flow in pair.flows if flow.drain]
    assert [flow.delivery_count for flow in drained] == [100]
    # Answered once: no drain round after round for credit the budget would not let come.
    assert _credit_requests(pair) == []
    assert pair.session.statistics().credit_requests_in_flight == 0


def test_with_the_budget_full_a_connection_holding_nothing_unsent_is_still_served() -> None:
    # A consumer that reads what it is sent (the adversary's prober, seed 65300) is not
    # starved by a budget others' queues keep full.
    pair = Pair()
    pair.publish(10)
    server = pair.session.waiting.server
    server.blocked = server.full = True
    pair.session.client_flow(pair.link, 0, 100, False, False)
    assert [request.credit for request in _credit_requests(pair)] == [1]
    waiting = pair.session.waiting
    for _ in range(20):
        pair.settle_all()
        # As the gateway after each pump (gateway/sending.py): once what it was sent has
        # left, the request that waited on it goes.
        if waiting.resumable:
            resume(waiting)
    assert len(pair.received) == 10
