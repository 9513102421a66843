"""A session consuming a queue of another worker through both ends of the channel, in memory:
a real Session and RemoteQueue on one side, an Owner and ClassicQueue on the other, every
frame encoded and read back (docs/workers.md). What the client sees must be what it sees of a
local queue, whatever the client's credit and however the frames are held up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Dispatch, Outcome
from sluicegate.session.channel.codec import FrameReader, encode
from sluicegate.session.channel.frames import (
    Attached,
    Confirm,
    CreditReply,
    Deliveries,
    Error,
    Frame,
    Publish,
    Settled,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.remote import Remote, RemoteQueue, WorkerDown
from sluicegate.session.outbound import LinkFlow, Session, route
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp
from sluicegate.wire.sections import DEFAULT_HEADER
from sluicegate.writer.writer import Writer

MAX_FRAME = 1 << 20


class Pair:
    """Worker A's session and worker B's queue, joined by the channel's two byte streams."""

    def __init__(self, ack_required: bool = False, max_queue_credit: int = 16) -> None:
        self.queue = ClassicQueue("q")
        self.remote = Remote(1)
        self.remote.opened()
        self.owner = Owner(lambda vhost, name: self.queue if name == "q" else None, 16)
        self.to_owner = FrameReader(MAX_FRAME)
        self.to_session = FrameReader(MAX_FRAME)
        self.writer = Writer()
        self.session = Session(self.writer, remote_incoming_window=1 << 20, max_queue_credit=16)
        self.link = self.session.attach_link(
            0, RemoteQueue("q", "/", self.remote), ack_required=ack_required
        )
        self.received: list[Message] = []
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
                route(self.remote.delivered(frame))
            elif type(frame) is Attached:
                # The owner took the consumer: the gateway answers the client's ATTACH now.
                assert self.remote.attached(frame) in (self.link, None)
            elif type(frame) is CreditReply:
                # None for a consumer detached since: nobody waits for the reply.
                replied = self.remote.replied(frame)
                if replied is not None:
                    self.session.credit_replied(self.link, replied[1])
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
