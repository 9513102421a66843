"""A message whose dead-lettering fails stays where it was; the rest of its batch goes on.

Pure queues: a poison message (message annotations nested past the codec's depth, which the
door refuses today but an older server's log may hold) is given up on by each reason, between
two good messages of the same queue.
"""

from __future__ import annotations

import pytest
from support.deaths import deaths_of

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import DEAD_LETTER_FAILED, Message
from sluicegate.queues.queue_type import Clock, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.decoding import MAX_DEPTH
from sluicegate.wire.encoding import encode

_NOW = 1_000_000
_TTL = 100


def _poison() -> Message:
    deep: Value = "poison"
    for _ in range(MAX_DEPTH + 6):
        deep = [deep]
    payload = encode(Described(0x72, {Symbol("x-d"): deep})) + encode(Described(0x77, "p"))
    return Message(payload)


def _good(body: str) -> Message:
    return Message(encode(Described(0x77, body)))


def _registry(arguments: dict[str, object]) -> QueueRegistry:
    registry = QueueRegistry(Clock(_NOW))
    registry.declare_exchange("dlx", "fanout")
    registry.declare_queue("dead")
    registry.bind("dlx", "dead", "")
    registry.declare_queue("work", {"x-dead-letter-exchange": "dlx", **arguments})
    return registry


_ARGUMENTS: dict[str, dict[str, object]] = {
    "expired": {"x-message-ttl": _TTL},
    "maxlen": {"x-max-length": 1},
    "delivery_limit": {"x-delivery-limit": 0},
    "rejected": {},
}


def _give_up(registry: QueueRegistry, reason: str) -> list[Message]:
    """Enqueue m0, the poison, m2 (and m3 for maxlen) and have the queue give up on the first
    three for ``reason``; return them."""
    work = registry.queue("work")
    messages = [_good("m0"), _poison(), _good("m2")]
    for message in messages:
        work.enqueue(message)
    if reason == "maxlen":
        work.enqueue(_good("m3"))
    elif reason == "expired":
        registry.clock.now += _TTL
        registry.expire()
    else:
        work.attach("c", ack_required=True)
        taken, _ = work.credit("c", 0, 3, False)
        assert taken == messages
        outcome = Outcome.REJECTED if reason == "rejected" else Outcome.MODIFIED
        work.settle("c", [m.seq for m in taken], outcome, True)
        work.detach("c", [])
    return messages


@pytest.mark.parametrize("reason", sorted(_ARGUMENTS))
def test_a_failing_dead_letter_stays_at_its_place_once_and_the_rest_goes_on(reason: str) -> None:
    registry = _registry(_ARGUMENTS[reason])
    work = registry.queue("work")
    assert isinstance(work, ClassicQueue)
    good, poison, other = _give_up(registry, reason)
    seq, expires = poison.seq, poison.expires
    assert registry.route_dead_letters() == []

    dead = registry.queue("dead")
    dead.attach("d", ack_required=True)
    copies, _ = dead.credit("d", 0, 10, False)
    assert [m.payload[-2:] for m in copies] == [good.payload[-2:], other.payload[-2:]]
    assert all(deaths_of(m.payload)[0][Symbol("reason")] == reason for m in copies)
    [failure] = registry.dead_letter_router.failures
    assert (failure.queue, failure.message, failure.kept) == ("work", f"{reason} message 1", True)
    assert "nested deeper" in failure.error

    # The poison keeps its place, its expiry and its count; it is never delivered.
    assert (poison.state, poison.seq, poison.expires) == (DEAD_LETTER_FAILED, seq, expires)
    assert work.statistics().dead_letter_failed == 1
    work.attach("late", ack_required=True)
    taken, _ = work.credit("late", 0, 10, False)
    assert poison not in taken
    # Later passes of the timer and the router neither retry it nor log it again.
    registry.clock.now += 10 * _TTL
    registry.expire()
    assert registry.route_dead_letters() == []
    assert len(registry.dead_letter_router.failures) == 1
    assert work.log_slots() == 1 + len(taken)

    # Purging the queue drops it, and the memory it held.
    for message in taken:
        work.settle("late", [message.seq], Outcome.ACCEPTED, False)
    assert registry.purge_queue("work") == 1
    assert work.statistics().dead_letter_failed == 0
    dead.settle("d", [m.seq for m in copies], Outcome.ACCEPTED, False)
    assert registry.held.total == 0


def test_a_refused_publish_that_fails_dead_lettering_is_reported_lost() -> None:
    """reject-publish-dlx: the publisher is told rejected, the message was never queued."""
    registry = _registry({"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    work = registry.queue("work")
    work.enqueue(_good("m0"))
    with pytest.raises(Exception, match="full"):
        work.enqueue(_poison())
    registry.route_dead_letters()
    [failure] = registry.dead_letter_router.failures
    assert (failure.queue, failure.kept) == ("work", False)
    assert work.statistics().ready == 1


def test_a_dead_letter_of_a_queue_purged_or_deleted_before_it_is_routed_goes_on() -> None:
    """The copy of a good message is still made; a poison one is lost with its queue."""
    registry = _registry(_ARGUMENTS["expired"])
    _give_up(registry, "expired")
    registry.delete_queue("work")
    registry.route_dead_letters()
    assert registry.queue("dead").statistics().ready == 2
    [failure] = registry.dead_letter_router.failures
    assert failure.kept is False
    registry.purge_queue("dead")
    assert registry.held.total == 0
