"""A consumer's session hands back deliveries it never sent, the consumer staying attached
(QueueType.give_back: a consumer across whose client stopped reading while others waited for
its worker's imports' part, session/waiting.py). Every queue type returns them as they were,
to be sent again in order and counted as never delivered."""

from __future__ import annotations

import pytest

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, OffsetSpec, Outcome, QueueType
from sluicegate.queues.quorum import QuorumQueue
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.volatile import VolatileQueue
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import read_header


def _payload(i: int) -> bytes:
    return encode(Described(0x77, f"m{i}"))


def _filled(queue: QueueType, count: int) -> None:
    for i in range(count):
        queue.enqueue(Message(_payload(i)))


def _queues() -> list[QueueType]:
    return [
        ClassicQueue("classic"),
        QuorumQueue("quorum", parse_arguments({"x-queue-type": "quorum"}), clock=Clock(1)),
    ]


@pytest.mark.parametrize("ack_required", [True, False])
@pytest.mark.parametrize("make", [0, 1])
def test_deliveries_given_back_are_sent_again_in_order_as_never_delivered(
    ack_required: bool, make: int
) -> None:
    queue = _queues()[make]
    queue.attach("c", ack_required=ack_required)
    _filled(queue, 5)
    delivered, _ = queue.credit("c", 0, 5, False)
    assert [m.seq for m in delivered] == [0, 1, 2, 3, 4]
    # The session gave its credit back first (session/outbound.py ``Session.stall``).
    queue.credit("c", 5, 0, False)
    assert queue.give_back("c", delivered[2:]) == []
    stats = queue.statistics()
    assert (stats.ready, stats.unacked) == (3, 2 if ack_required else 0)
    assert stats.unacked_bytes == (sum(m.held for m in delivered[:2]) if ack_required else 0)
    assert stats.delivered == 2
    again, reply = queue.credit("c", 5, 10, False)
    assert [m.seq for m in again] == [2, 3, 4]
    assert [read_header(m.read()).delivery_count for m in again] == [0, 0, 0]
    assert reply is not None
    assert reply.available == 0
    if ack_required:
        queue.settle("c", [m.seq for m in delivered[:2] + again], Outcome.ACCEPTED, False)
    stats = queue.statistics()
    assert (stats.ready, stats.unacked, stats.delivered) == (0, 0, 5)


def test_a_browser_walks_what_it_gave_back_again() -> None:
    queue = ClassicQueue("q")
    queue.attach("b", ack_required=False, options=ConsumerOptions(browse=True))
    _filled(queue, 4)
    seen, _ = queue.credit("b", 0, 4, False)
    queue.credit("b", 4, 0, False)
    queue.give_back("b", seen[1:])
    again, _ = queue.credit("b", 4, 10, False)
    assert [m.seq for m in again] == [1, 2, 3]
    assert queue.statistics().ready == 4


def test_a_stream_reader_reads_what_it_gave_back_again() -> None:
    queue = StreamQueue("s", parse_arguments({"x-queue-type": "stream"}), clock=Clock())
    _filled(queue, 6)
    queue.attach("r", ack_required=True, options=ConsumerOptions(offset=OffsetSpec("first")))
    read, _ = queue.credit("r", 0, 4, False)
    assert [m.seq for m in read] == [0, 1, 2, 3]
    queue.credit("r", 4, 0, False)
    queue.give_back("r", read[2:])
    again, _ = queue.credit("r", 4, 10, False)
    assert [m.seq for m in again] == [2, 3, 4, 5]


def test_a_direct_reply_to_requester_drops_the_replies_it_gave_back() -> None:
    queue = VolatileQueue("amq.rabbitmq.reply-to.x")
    queue.attach("requester", ack_required=False)
    queue.credit("requester", 0, 2, False)
    dispatched = queue.enqueue(Message(_payload(0)))
    assert queue.give_back("requester", [message for _, message in dispatched]) == []
    assert queue.dropped == 1


def test_a_consumer_that_left_gives_nothing_back() -> None:
    queue = ClassicQueue("q")
    assert queue.give_back("nobody", [Message(_payload(0))]) == []
