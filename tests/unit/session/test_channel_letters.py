"""The dead letters a consumer's outcomes make on another worker are charged to its link on its
own worker, as a local queue's are (issue 31; session/channel/owner.py, remote.py).

Worker A's real session consumes ``q`` of worker B's registry through both ends of the channel,
every frame encoded and read back; ``q`` dead-letters into a fanout bound to three queues. The
owner charges a rejection's letters to the consumer and reports what it owes
(:class:`~sluicegate.session.channel.frames.Letters`); A charges the change to the link against
its connection's dead-letter debt, which holds it at the limit and lets it go once the letters
are stored.
"""

from __future__ import annotations

from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Dispatch, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.codec import FrameReader, encode
from sluicegate.session.channel.frames import (
    Attached,
    CreditReply,
    Deliveries,
    Error,
    Frame,
    Letters,
    Short,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.remote import Remote, RemoteQueue
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.outbound import LinkFlow, Session, apply_hold, route
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp
from sluicegate.writer.writer import Writer

MAX_FRAME = 1 << 20
LIMIT = 8
FAN_OUT = ("d1", "d2", "d3")


class Pair:
    """A's session and debt, B's registry and owner, and the channel between them."""

    def __init__(self) -> None:
        registry = self.registry = QueueRegistry(Clock(1_000))
        registry.declare_exchange("fan", "fanout")
        registry.declare_queue("q", {"x-dead-letter-exchange": "fan"})
        for name in FAN_OUT:
            registry.declare_queue(name, {})
            registry.bind("fan", name)
        self.owner = Owner(
            lambda vhost, name: registry.get(name),
            16,
            routers=lambda vhost: registry.dead_letter_router,
        )
        self.debt = DeadLetterDebt(LIMIT)
        self.remote = Remote(1)
        self.remote.opened()
        self.remote.debt_of = lambda key: self.debt
        self.to_owner = FrameReader(MAX_FRAME)
        self.to_session = FrameReader(MAX_FRAME)
        self.session = Session(Writer(), remote_incoming_window=1 << 20, max_queue_credit=16)
        self.link = self.session.attach_link(
            0, RemoteQueue("q", "/", self.remote), ack_required=True
        )
        self.received: list[Message] = []
        self.reports: list[Letters] = []

    def publish(self, count: int) -> None:
        queue = self.registry.get("q")
        assert queue is not None
        for n in range(count):
            route(queue.enqueue(Message(amqp(Described(0x77, f"m{n}")))))

    def cross(self) -> None:
        """Every frame either way crosses, until the channel is quiet; the session pumps."""
        for _ in range(20):
            up = b"".join(piece for frame in self.remote.outgoing for piece in encode(frame))
            self.remote.outgoing.clear()
            down: list[Frame] = []
            for frame in self.to_owner.feed(up):
                frames, local = self.owner.receive(frame)
                route(local)
                down.extend(frames)
            down.extend(self.owner.flush())
            data = b"".join(piece for frame in down for piece in encode(frame))
            for frame in self.to_session.feed(data):
                self._down(frame)
            for action in self.session.send_pending():
                if not isinstance(action, LinkFlow):
                    self.received.append(action[1])  # type: ignore[index]
            if not down and not self.remote.outgoing:
                return

    def _down(self, frame: Frame) -> None:
        if type(frame) is Deliveries:
            delivered = self.remote.delivered(frame)
            if delivered is not None:
                self.session.deliver_all(self.link, delivered[1])
        elif type(frame) is CreditReply:
            replied = self.remote.replied(frame)
            if replied is not None:
                self.session.credit_replied(self.link, replied[1])
        elif type(frame) is Short:
            shorted = self.remote.shorted(frame)
            if shorted is not None:
                self.session.shorted(self.link, shorted[1])
        elif type(frame) is Letters:
            self.reports.append(frame)
            debt = self.remote.letters(frame)
            if debt is not None:
                apply_hold(debt)
        else:
            assert type(frame) is Attached

    def grant(self, credit: int) -> None:
        client = self.link.client_flow_ctl
        self.session.client_flow(self.link, client.delivery_count, credit, False, False)
        self.cross()

    def reject(self, count: int) -> None:
        seqs = [message.seq for message in self.received[:count]]
        del self.received[:count]
        route(self.session.settle(self.link, seqs, Outcome.REJECTED, False))
        self.cross()

    def store_letters(self) -> list[Dispatch]:
        """B routes its dead letters (the budget with room), as its reactor pass does."""
        dispatches = self.registry.route_dead_letters()
        self.cross()
        return dispatches


def test_a_remote_queues_letters_hold_the_consumer_until_they_are_stored() -> None:
    pair = Pair()
    pair.publish(40)
    pair.grant(10)
    assert len(pair.received) == 10
    pair.reject(LIMIT)
    # B charged the rejections' letters to the consumer and told A, which holds the link.
    assert pair.reports[-1].owed == LIMIT
    assert (pair.debt.debt, pair.debt.held, pair.link.held) == (LIMIT, True, True)
    # Held: the queue on B was asked for no credit, so more credit brings nothing new.
    pair.grant(10)
    assert len(pair.received) == 2
    queue = pair.registry.get("q")
    assert queue is not None
    before = queue.statistics().ready
    # The letters are stored: repaid on B, reported, and A lets the link go.
    pair.store_letters()
    assert pair.reports[-1].owed == 0
    assert (pair.debt.debt, pair.debt.held, pair.link.held) == (0, False, False)
    for name in FAN_OUT:
        fanned = pair.registry.get(name)
        assert fanned is not None
        assert fanned.statistics().ready == LIMIT
    assert len(pair.received) == 12
    assert queue.statistics().ready == before - 10


def test_a_consumer_that_detaches_owing_is_repaid_and_then_forgotten() -> None:
    pair = Pair()
    pair.publish(4)
    pair.grant(4)
    pair.reject(2)
    assert pair.debt.debt == 2
    # The link goes with letters outstanding: A still charges them until B stored them.
    route(pair.session.detach_link(pair.link))
    pair.cross()
    assert pair.debt.debt == 2
    assert list(pair.remote.owed) == [1]
    pair.store_letters()
    assert pair.debt.debt == 0
    assert pair.remote.owed == {}
    assert pair.debt.causes == {}


def test_a_rejection_that_makes_no_letter_is_forgotten_at_the_detach() -> None:
    pair = Pair()
    pair.registry.delete_exchange("fan")
    pair.publish(2)
    pair.grant(2)
    pair.reject(1)
    route(pair.session.detach_link(pair.link))
    pair.cross()
    # The dead-letter exchange is gone: the letter is dropped on B as it routes it.
    pair.store_letters()
    assert pair.debt.debt == 0
    assert pair.remote.owed == {}


def test_letters_of_a_channel_that_ended_are_forgiven() -> None:
    pair = Pair()
    pair.publish(20)
    pair.grant(10)
    pair.reject(LIMIT)
    assert pair.link.held
    pair.remote.lost()
    debts = pair.remote.forgive()
    assert debts == [pair.debt]
    apply_hold(pair.debt)
    assert (pair.debt.debt, pair.debt.held, pair.link.held) == (0, False, False)


def test_a_consumer_the_owner_ends_owing_nothing_is_forgotten() -> None:
    pair = Pair()
    pair.registry.delete_exchange("fan")
    pair.publish(2)
    pair.grant(2)
    pair.reject(1)
    pair.store_letters()
    assert list(pair.remote.owed) == [1]
    # The owner ends the consumer (its lock expired, say): no Detach, so no last report.
    assert pair.remote.refused(Error(1, "amqp:resource-deleted", "gone")) is pair.link
    assert pair.remote.owed == {}
