"""The owner sends a remote consumer no more bytes than its request's limit (frames.Credit):
the rest waits on the owner, in order, its session told what the next costs (frames.Short),
and what waits goes back to the queue as never sent when a request's credit leaves no room for
it, a drain spends it, or the consumer detaches. The counts crossing stay the consumer's: the
queue end checks every reply (session/channel/ends.py)."""

from __future__ import annotations

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import QueueType
from sluicegate.session.channel.frames import (
    Attach,
    Attached,
    Credit,
    CreditReply,
    Deliveries,
    Detach,
    Frame,
    Short,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.waiting import WAITING_DELIVERY_COST
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

SMALL = encode(Described(0x77, "s" * 100))
LARGE = encode(Described(0x77, "L" * 10_000))


def _cost(payload: bytes) -> int:
    return len(payload) + WAITING_DELIVERY_COST


class Consumer:
    """One remote consumer of queue ``q`` on an owner, as its session side would drive it."""

    def __init__(self, payloads: list[bytes], ack_required: bool = True) -> None:
        self.queue = ClassicQueue("q")
        for payload in payloads:
            self.queue.enqueue(Message(payload))
        queue: QueueType = self.queue
        self.owner = Owner(lambda vhost, name: queue, 256)
        frames, _ = self.owner.receive(Attach(1, "/", "q", ack_required, False, 0))
        assert [type(frame) for frame in frames] == [Attached]
        self.received: list[bytes] = []
        self.arrived = 0
        self.delivery_count = 0

    def ask(self, credit: int, room: int, drain: bool = False) -> list[Frame]:
        """A request for ``credit`` from what arrived, with ``room`` bytes reserved."""
        frames, _ = self.owner.receive(
            Credit(1, self.delivery_count, credit, drain, False, self.arrived + room)
        )
        for frame in frames:
            if type(frame) is Deliveries:
                self.received.extend(bytes(payload) for payload in frame.payloads)
                self.arrived += sum(map(_cost, frame.payloads))
                self.delivery_count += len(frame.seqs)
            elif type(frame) is CreditReply:
                self.delivery_count = frame.delivery_count
        return frames

    def reply(self, frames: list[Frame]) -> CreditReply:
        replies = [frame for frame in frames if type(frame) is CreditReply]
        assert len(replies) == 1
        return replies[0]


def test_what_passes_the_limit_waits_in_order_and_the_session_is_told_once() -> None:
    consumer = Consumer([SMALL, SMALL, LARGE, SMALL])
    frames = consumer.ask(10, 2 * _cost(SMALL))
    assert consumer.received == [SMALL, SMALL]
    assert Short(1, _cost(LARGE)) in frames
    reply = consumer.reply(frames)
    # The two held count as sent on the credit still out, not as delivered.
    assert (reply.delivery_count, reply.credit, reply.available) == (2, 8, 2)
    # A larger limit lets the held go first, in order.
    frames = consumer.ask(8, _cost(LARGE) + _cost(SMALL))
    assert consumer.received == [SMALL, SMALL, LARGE, SMALL]
    assert not [frame for frame in frames if type(frame) is Short]
    assert consumer.reply(frames).credit == 6


def test_a_request_whose_credit_leaves_no_room_for_what_waits_gives_it_back_unsent() -> None:
    consumer = Consumer([SMALL, LARGE, LARGE, LARGE])
    consumer.ask(10, _cost(SMALL))
    assert consumer.received == [SMALL]
    assert len(consumer.owner.consumers[1].held) == 3
    # Credit for one: the two newest go back to the queue as never sent.
    reply = consumer.reply(consumer.ask(1, 0))
    assert (reply.delivery_count, reply.credit) == (1, 1)
    assert consumer.queue.statistics().ready == 2
    # Asked again with room for all: each message once, in order.
    consumer.ask(10, 3 * _cost(LARGE))
    assert consumer.received == [SMALL, LARGE, LARGE, LARGE]
    assert consumer.queue.statistics().ready == 0


def test_a_drain_sends_what_fits_and_spends_the_rest_of_its_credit() -> None:
    consumer = Consumer([SMALL, LARGE, LARGE])
    consumer.ask(10, _cost(SMALL))
    frames = consumer.ask(10, _cost(LARGE), drain=True)
    assert consumer.received == [SMALL, LARGE]
    reply = consumer.reply(frames)
    # AMQP 1.0 §2.6.7: a drain advances the delivery-count by the credit it did not use.
    assert (reply.delivery_count, reply.credit, reply.drain) == (11, 0, True)
    assert not [frame for frame in frames if type(frame) is Short]
    # The one that did not fit is back in the queue, for the next request.
    assert consumer.queue.statistics().ready == 1
    consumer.ask(5, _cost(LARGE))
    assert consumer.received == [SMALL, LARGE, LARGE]


def test_what_waits_goes_back_as_never_sent_when_the_consumer_detaches() -> None:
    for ack_required in (True, False):
        consumer = Consumer([SMALL, LARGE, LARGE], ack_required)
        consumer.ask(10, _cost(SMALL))
        held = consumer.owner.consumers[1].held
        assert len(held) == 2
        if not ack_required:
            # Pre-settled ones are gone from their queue: the owner counts them meanwhile.
            assert consumer.owner.recent_bytes >= 2 * len(LARGE)
        consumer.owner.receive(Detach(1, consumer.delivery_count))
        stats = consumer.queue.statistics()
        # The two held back, and the one sent unsettled back as a failed attempt.
        assert (stats.ready, stats.unacked) == ((3 if ack_required else 2), 0)
        assert consumer.owner.recent_bytes <= len(SMALL) + 64


def test_a_presettled_consumers_held_deliveries_are_counted_once_sent() -> None:
    consumer = Consumer([SMALL, LARGE, LARGE], ack_required=False)
    consumer.ask(10, _cost(SMALL))
    owner = consumer.owner
    assert owner.recent_bytes == len(SMALL) + 2 * len(LARGE)
    # Sent once the limit lets them: now recent deliveries, counted there and only there
    # (before, each stayed counted as held too: 20,000 bytes more for good).
    consumer.ask(10, 2 * _cost(LARGE))
    assert consumer.received == [SMALL, LARGE, LARGE]
    assert owner.recent_bytes == len(SMALL) + 2 * len(LARGE)
    owner.receive(Detach(1, consumer.delivery_count))
    assert owner.recent_bytes == 0


def test_a_presettled_consumer_of_a_fan_outs_copies_counts_no_payload_another_queue_counts() -> (
    None
):
    """Adversary seed 66181: a fan-out's copies delivered to another worker's pre-settled
    consumer each counted their payload again, though the fan-out's other queues counted it and
    their queue gave back only its overhead."""
    held = HeldBytes()
    fanned = ClassicQueue("q", held=held)
    other = ClassicQueue("other", held=held)
    for _ in range(3):
        message = Message(LARGE)
        copy = message.copy()
        fanned.enqueue(message)
        other.enqueue(copy)
    before = held.total
    assert before == 3 * (len(LARGE) + 2 * MESSAGE_OVERHEAD)
    queue: QueueType = fanned
    owner = Owner(lambda vhost, name: queue, 256, held=held)
    owner.receive(Attach(1, "/", "q", False, False, 0))
    frames, _ = owner.receive(Credit(1, 0, 10, False, False, 10 * _cost(LARGE)))
    assert sum(len(frame.seqs) for frame in frames if type(frame) is Deliveries) == 3
    # Gone from their queue, kept by the owner: their payload is still the other queue's.
    assert held.total == 3 * (len(LARGE) + MESSAGE_OVERHEAD)
    assert owner.recent_bytes == 0
    # The other queue lets go: the payload stays counted while the owner keeps the messages,
    # once, and goes with them.
    other.purge()
    assert held.total + owner.recent_bytes == 3 * len(LARGE)
    owner.receive(Detach(1, 3))
    assert held.total + owner.recent_bytes == 0
    # The channel ends: what the owner gave back of payloads the queues counted first leaves
    # their count with it, not a count that outlives the owner.
    owner.close()
    assert (held.total, owner.recent_bytes) == (0, 0)
