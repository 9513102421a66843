"""A quorum queue's delayed retry, pure: ``modified`` with ``x-opt-delivery-time`` (RabbitMQ
4.3) keeps the message in the queue, out of every consumer's reach until that time."""

from __future__ import annotations

from sluicegate.queues.delayed_returns import DELAYED_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol, Timestamp
from sluicegate.wire.encoding import encode

START = 1_000_000


def _message(body: str) -> Message:
    return Message(encode(Described(0x77, body)))


def _registry() -> tuple[QueueRegistry, Clock]:
    clock = Clock(START)
    return QueueRegistry(clock), clock


def _delivery_time(when: int) -> bytes:
    return encode({Symbol("x-opt-delivery-time"): when})


def test_a_delayed_return_reaches_no_consumer_before_its_time() -> None:
    registry, clock = _registry()
    queue = registry.declare_queue("qq", {"x-queue-type": "quorum"})
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    queue.attach("filtered", ack_required=True, options=ConsumerOptions(filter=bool))
    queue.attach("browser", ack_required=False, options=ConsumerOptions(browse=True))
    (message,), _ = queue.credit("c", 0, 10, False)
    dispatches = queue.settle(
        "c",
        [message.seq],
        Outcome.MODIFIED,
        True,
        annotations=_delivery_time(START + 500),
    )
    assert dispatches == []
    held = registry.held.total
    # Still the queue's, counted among its messages, but offered to nobody.
    assert queue.statistics().ready == 1
    assert queue.statistics().unacked == 0
    for consumer in ("filtered", "browser"):
        assert queue.credit(consumer, 0, 10, False)[0] == []
    assert registry.next_deadline() == START + 500
    clock.now = START + 499
    assert registry.expire() == []
    clock.now = START + 500
    # Due: served to the first consumer in rotation with credit left.
    dispatches = registry.expire()
    assert [(key, m.seq) for key, m in dispatches] == [("c", message.seq)]
    # Its entry's charge went with it; the message itself is counted as before.
    assert registry.held.total == held - DELAYED_OVERHEAD
    assert registry.next_deadline() is None


def test_a_timestamp_counts_and_a_past_or_absent_time_returns_at_once() -> None:
    registry, _ = _registry()
    queue = registry.declare_queue("qq", {"x-queue-type": "quorum"})
    for body in ("a", "b", "c"):
        queue.enqueue(_message(body))
    queue.attach("c", ack_required=True)
    first, second, third = queue.credit("c", 0, 3, False)[0]
    later = encode({Symbol("x-opt-delivery-time"): Timestamp(START + 100)})
    queue.settle("c", [first.seq], Outcome.MODIFIED, False, annotations=later)
    past = _delivery_time(START - 1)
    queue.settle("c", [second.seq], Outcome.MODIFIED, False, annotations=past)
    other = encode({Symbol("x-opt-other"): START + 100})
    queue.settle("c", [third.seq], Outcome.MODIFIED, False, annotations=other)
    again, _ = queue.credit("c", 3, 10, False)
    assert [m.seq for m in again] == [second.seq, third.seq]


def test_a_classic_queue_ignores_the_delivery_time() -> None:
    registry, _ = _registry()
    queue = registry.declare_queue("classic")
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    (message,), _ = queue.credit("c", 0, 1, False)
    queue.settle("c", [message.seq], Outcome.MODIFIED, True, annotations=_delivery_time(START + 9))
    assert [m.seq for m in queue.credit("c", 1, 1, False)[0]] == [message.seq]


def test_purge_and_delete_take_the_delayed_returns_and_their_charge() -> None:
    registry, clock = _registry()
    queue = registry.declare_queue("qq", {"x-queue-type": "quorum"})
    empty = registry.held.total
    for index in range(10):
        queue.enqueue(_message(str(index)))
    queue.attach("c", ack_required=True)
    taken, _ = queue.credit("c", 0, 10, False)
    queue.settle(
        "c",
        [m.seq for m in taken[:6]],
        Outcome.MODIFIED,
        False,
        annotations=_delivery_time(START + 1_000),
    )
    queue.settle("c", [m.seq for m in taken[6:]], Outcome.RELEASED, False)
    assert queue.statistics().ready == 10
    assert registry.purge_queue("qq") == 10
    assert registry.held.total == empty
    # Their time comes: nothing is left to serve, nothing is counted twice.
    clock.now = START + 1_000
    assert registry.expire() == []
    assert registry.held.total == empty
    assert queue.statistics().ready == 0
