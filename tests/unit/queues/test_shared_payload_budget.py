"""The memory budget counts a fan-out's shared payload once (queues/held_bytes.py, issue 31).

Pure registries: copies of one message share its bytes, so the held bytes count them once and
each copy's overhead, and every count is matched by its refund whatever order the queues let
their copies go in (settled, expired, purged, deleted, modified, dead-lettered, dropped from a
stream).
"""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import read_header

# The fanout's queues: every kind that holds plain messages, with expiry and dead-lettering.
_QUEUES: dict[str, dict[str, object]] = {
    "plain": {},
    "ttl": {"x-message-ttl": 50},
    "dlq": {"x-dead-letter-exchange": "dlx"},
    "limited": {"x-max-length": 3, "x-dead-letter-exchange": "dlx"},
    "quorum": {"x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"},
    "stream": {"x-queue-type": "stream", "x-max-length-bytes": 20_000},
}
_CONSUMED = ("plain", "ttl", "dlq", "limited", "quorum")
_OUTCOMES = (
    (Outcome.ACCEPTED, False, None),
    (Outcome.RELEASED, False, None),
    (Outcome.MODIFIED, True, None),
    (Outcome.MODIFIED, False, encode({Symbol("x-opt-seen"): "yes"})),
    (Outcome.REJECTED, False, None),
)


def _payload(size: int) -> bytes:
    return encode(Described(0x77, "x" * size))


def _fanout() -> tuple[QueueRegistry, Clock]:
    clock = Clock(1_000)
    registry = QueueRegistry(clock)
    registry.declare_exchange("fx", "fanout")
    registry.declare_exchange("dlx", "fanout")
    for name, arguments in _QUEUES.items():
        registry.declare_queue(name, arguments)
        registry.bind("fx", name)
    for name in ("dead1", "dead2"):
        registry.declare_queue(name)
        registry.bind("dlx", name)
    return registry, clock


def _publish(registry: QueueRegistry, payload: bytes) -> None:
    """As gateway/publishing.py does: the copies first, then each queue stores its own."""
    message = Message(payload)
    queues = registry.route("fx", "", payload)
    copies = [message, *(message.copy() for _ in queues[1:])]
    for queue, copy in zip(queues, copies, strict=True):
        try:
            queue.enqueue(copy)
        except Exception:
            continue


def test_a_fanout_counts_its_payload_once_and_each_copys_overhead() -> None:
    registry = QueueRegistry(Clock(1_000))
    registry.declare_exchange("fx", "fanout")
    for index in range(20):
        registry.declare_queue(f"q{index}")
        registry.bind("fx", f"q{index}")
    payload = _payload(1_000_000)
    _publish(registry, payload)
    assert registry.held.total == len(payload) + 20 * MESSAGE_OVERHEAD
    # The queues let go in any order: the payload goes with the last.
    left = 20
    for index in (7, 0, 19, 3, *range(20)):
        if registry.purge_queue(f"q{index}"):
            left -= 1
        if left:
            assert registry.held.total == len(payload) + left * MESSAGE_OVERHEAD
    assert registry.held.total == 0


def test_a_failed_delivery_keeps_a_copy_in_its_share_and_is_stamped_as_it_is_read() -> None:
    # Seed 65600: fan-out copies coming back unsettled each left the share with the new
    # header, and a whole payload per copy took the count past the ceiling.
    held = HeldBytes()
    first = Message(_payload(1_000))
    second = first.copy()
    held.take(first)
    held.take(second)
    size = len(first.payload)
    held.rewrite(second, second.count_failed_delivery)
    assert second.share is first.share
    assert held.total == size + 2 * MESSAGE_OVERHEAD
    assert read_header(second.read()).delivery_count == 1
    assert read_header(second.copy().read()).delivery_count == 1
    assert read_header(first.read()).delivery_count == 0
    held.let_go(first)
    held.let_go(second)
    assert held.total == 0


def test_quorum_copies_coming_back_keep_their_share_and_read_their_redelivery_counts() -> None:
    # A quorum queue's return stamped its counts into each copy's payload, a whole payload
    # per copy of a fan-out: now they are stamped as the copy is read.
    registry = QueueRegistry(Clock(1_000))
    registry.declare_exchange("fx", "fanout")
    names = [f"qq{index}" for index in range(10)]
    for name in names:
        registry.declare_queue(name, {"x-queue-type": "quorum"})
        registry.bind("fx", name)
    payload = _payload(100_000)
    _publish(registry, payload)
    held = registry.held.total
    assert held == len(payload) + 10 * MESSAGE_OVERHEAD
    for name in names:
        queue = registry.queue(name)
        queue.attach("c", ack_required=True)
        taken, _ = queue.credit("c", 0, 1, False)
        queue.settle("c", [taken[0].seq], Outcome.RELEASED, False)
    assert registry.held.total == held
    queue = registry.queue(names[0])
    again, _ = queue.credit("c", 1, 1, False)
    assert again[0].read() != payload
    assert b"x-acquired-count" in again[0].read()
    assert again[0].read_size() == len(again[0].read())


def _annotations() -> bytes:
    return encode({Symbol("x-opt-seen"): "yes"})


def test_a_copy_given_new_bytes_leaves_the_share_and_counts_its_own() -> None:
    held = HeldBytes()
    first = Message(_payload(1_000))
    second = first.copy()
    held.take(first)
    held.take(second)
    size = len(first.payload)
    assert held.total == size + 2 * MESSAGE_OVERHEAD
    held.rewrite(second, partial(second.annotate, _annotations()))
    assert second.share is None
    assert held.total == size + len(second.payload) + 2 * MESSAGE_OVERHEAD
    # The one left in the share refunds the shared bytes; the other its own.
    held.let_go(first)
    assert held.total == len(second.payload) + MESSAGE_OVERHEAD
    held.let_go(second)
    assert held.total == 0


def test_a_change_that_fails_leaves_the_count_as_it_was() -> None:
    held = HeldBytes()
    # A header section whose list cannot be decoded: its delivery-count cannot be raised.
    first = Message(b"\x00\x53\x70\xff")
    second = first.copy()
    held.take(first)
    held.take(second)
    before = held.total
    with pytest.raises(DecodeError):
        held.rewrite(first, first.count_failed_delivery)
    assert held.total == before
    assert first.share is second.share
    held.let_go(second)
    held.let_go(first)
    assert held.total == 0


def test_a_browsers_copy_of_a_counted_message_adds_only_its_overhead() -> None:
    held = HeldBytes()
    queued = Message(_payload(1_000))
    held.take(queued)
    browsed = queued.copy(counted=True)
    held.take(browsed)
    assert held.total == len(queued.payload) + 2 * MESSAGE_OVERHEAD
    # The queue drops its message first: the browser's copy still counts the payload.
    held.let_go(queued)
    assert held.total == len(queued.payload) + MESSAGE_OVERHEAD
    held.let_go(browsed)
    assert held.total == 0


_STEP = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 3_000)),
    st.tuples(st.just("consume"), st.sampled_from(_CONSUMED), st.integers(1, 4), st.integers(0, 4)),
    st.tuples(st.just("expire"), st.integers(1, 100)),
    st.tuples(st.just("purge"), st.sampled_from((*_QUEUES, "dead1", "dead2"))),
    st.tuples(st.just("dead-letters")),
    st.tuples(st.just("detach"), st.sampled_from(_CONSUMED)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_every_count_of_a_fanouts_copies_is_refunded_whatever_the_order(
    steps: list[tuple[object, ...]],
) -> None:
    registry, clock = _fanout()
    attached: set[str] = set()
    for step in steps:
        kind = step[0]
        if kind == "publish":
            _publish(registry, _payload(int(step[1])))  # type: ignore[call-overload]
        elif kind == "consume":
            name, credit, choice = str(step[1]), int(step[2]), int(step[3])  # type: ignore[call-overload]
            queue = registry.queue(name)
            if name not in attached:
                queue.attach("c", ack_required=True)
                attached.add(name)
            messages, _ = queue.credit("c", 0, credit, False)
            outcome, failed, annotations = _OUTCOMES[choice]
            queue.settle("c", [m.seq for m in messages], outcome, failed, annotations=annotations)
        elif kind == "expire":
            clock.now += int(step[1])  # type: ignore[call-overload]
            registry.expire()
        elif kind == "purge":
            registry.purge_queue(str(step[1]))
        elif kind == "dead-letters":
            registry.route_dead_letters()
        else:
            name = str(step[1])
            if name in attached:
                registry.queue(name).detach("c", [])
                attached.discard(name)
        assert registry.held.total >= 0
    for name in attached:
        registry.queue(name).detach("c", [])
    while registry.dead_letters:
        registry.route_dead_letters()
    for name in registry.queue_names():
        registry.delete_queue(name)
    assert registry.held.total == 0
