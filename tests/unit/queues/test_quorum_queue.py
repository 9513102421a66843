"""The quorum queue, pure: RabbitMQ 4's quorum semantics on one node."""

from __future__ import annotations

import pytest

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.dead_lettering import LETTERS_PER_PASS
from sluicegate.queues.errors import PreconditionFailed, ResourceLimitExceeded
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, Outcome
from sluicegate.queues.quorum import DEAD_LETTER_RETRY_MS, KEPT_LETTER_OVERHEAD, QuorumQueue
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.annotations import annotations_offset
from sluicegate.wire.decoding import decode
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import read_header


def _message(body: str, priority: int | None = None) -> Message:
    header = b"" if priority is None else b"\x00\x53\x70" + encode([None, priority])
    return Message(header + encode(Described(0x77, body)))


def _queue(arguments: dict[str, object] | None = None) -> QuorumQueue:
    return QuorumQueue(
        "qq", parse_arguments({"x-queue-type": "quorum", **(arguments or {})}), clock=Clock(1_000)
    )


def _body(message: Message) -> Value:
    """The amqp-value body: the last section."""
    pos = 0
    value: Value = None
    while pos < len(message.payload):
        section, pos = decode(message.payload, pos)
        assert isinstance(section, Described)
        value = section.value
    return value


def _annotations(message: Message) -> dict[Value, Value]:
    pos = 0
    while pos < len(message.payload):
        section, pos = decode(message.payload, pos)
        assert isinstance(section, Described)
        if section.descriptor == 0x72:
            assert isinstance(section.value, dict)
            return section.value
    return {}


def _take(queue: QuorumQueue, consumer: str, credit: int) -> list[Message]:
    delivered, _ = queue.credit(consumer, 0, credit, False)
    return delivered


def test_a_returned_message_is_served_before_the_others() -> None:
    queue = _queue()
    for index in range(5):
        queue.enqueue(_message(f"m{index}"))
    queue.attach("c", ack_required=True)
    first = _take(queue, "c", 3)
    assert [_body(m) for m in first] == ["m0", "m1", "m2"]
    # m2 then m0 come back: they are served first, in the order they came back.
    queue.settle("c", [first[2].seq], Outcome.RELEASED, False)
    queue.settle("c", [first[0].seq], Outcome.RELEASED, False)
    delivered, _ = queue.credit("c", 3, 4, False)
    assert [_body(m) for m in delivered] == ["m2", "m0", "m3", "m4"]


def test_high_priority_messages_are_served_two_to_one() -> None:
    queue = _queue()
    for index in range(4):
        queue.enqueue(_message(f"n{index}"))
        queue.enqueue(_message(f"h{index}", priority=9))
    queue.attach("c", ack_required=False)
    # Two high, then the older of the two heads (a normal one), and so on.
    assert [_body(m) for m in _take(queue, "c", 8)] == [
        "h0",
        "h1",
        "n0",
        "h2",
        "h3",
        "n1",
        "n2",
        "n3",
    ]


def test_the_delivery_limit_is_20_returns_and_a_release_leaves_the_header_alone() -> None:
    queue = _queue({"x-dead-letter-exchange": "dlx"})
    queue.enqueue(_message("poison"))
    queue.attach("c", ack_required=True)
    count = 0
    for attempt in range(21):
        (message,) = queue.credit("c", attempt, 1, False)[0]
        queue.settle("c", [message.seq], Outcome.RELEASED, False)
        count += 1
    # Delivered 21 times, back 21 times: one more than the limit, so given up on.
    assert count == 21
    assert queue.statistics().ready == 0
    (letter,) = queue.dead_letters
    assert letter.reason == "delivery_limit"
    # RabbitMQ 4 raises the header's delivery-count only for failed deliveries.
    assert read_header(letter.message.read()).delivery_count == 0


def test_modified_delivery_failed_counts_in_the_header_and_a_negative_limit_means_none() -> None:
    queue = _queue({"x-delivery-limit": -1})
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    for attempt in range(30):
        (message,) = queue.credit("c", attempt, 1, False)[0]
        queue.settle("c", [message.seq], Outcome.MODIFIED, True)
    assert queue.statistics().ready == 1
    (message,) = queue.credit("c", 30, 1, False)[0]
    assert read_header(message.read()).delivery_count == 30


def test_modified_undeliverable_here_dead_letters_with_the_consumers_annotations() -> None:
    queue = _queue({"x-dead-letter-exchange": "dlx"})
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    (message,) = _take(queue, "c", 1)
    added = encode({Symbol("x-opt-reason"): "bad input"})
    queue.settle(
        "c", [message.seq], Outcome.MODIFIED, True, undeliverable_here=True, annotations=added
    )
    (letter,) = queue.dead_letters
    assert letter.reason == "rejected"
    assert _annotations(letter.message)[Symbol("x-opt-reason")] == "bad input"
    assert read_header(letter.message.read()).delivery_count == 1
    assert queue.statistics().rejected == 1


def test_annotations_of_a_modified_outcome_stay_with_the_requeued_message() -> None:
    queue = _queue()
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    (message,) = _take(queue, "c", 1)
    for note in ("first", "second"):
        added = encode({Symbol("x-opt-note"): note, Symbol(f"x-opt-{note}"): True})
        queue.settle("c", [message.seq], Outcome.MODIFIED, False, annotations=added)
        (message,) = queue.credit("c", 1 if note == "first" else 2, 1, False)[0]
    annotations = _annotations(message)
    assert annotations[Symbol("x-opt-note")] == "second"
    assert annotations[Symbol("x-opt-first")] is True
    assert annotations[Symbol("x-opt-second")] is True
    assert _body(message) == "m"
    assert annotations_offset(message.payload) is None


def test_a_consumer_that_leaves_returns_its_messages_without_failing_them() -> None:
    queue = _queue({"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    queue.enqueue(_message("m"))
    for attempt in range(2):
        queue.attach(f"c{attempt}", ack_required=True)
        _take(queue, f"c{attempt}", 1)
        queue.detach(f"c{attempt}", [])
    # Back twice, past a limit of 1.
    (letter,) = queue.dead_letters
    assert letter.reason == "delivery_limit"
    assert read_header(letter.message.read()).delivery_count == 0


def test_single_active_consumer_of_higher_priority_takes_over_once_the_active_one_is_idle() -> None:
    queue = _queue({"x-single-active-consumer": True})
    for index in range(4):
        queue.enqueue(_message(f"m{index}"))
    queue.attach("low", ack_required=True)
    (held,) = _take(queue, "low", 1)
    queue.attach("high", ack_required=True, options=ConsumerOptions(priority=5))
    # The active consumer is quiescing: no new messages while it holds one.
    assert queue.credit("low", 1, 5, False)[0] == []
    assert queue.credit("high", 0, 5, False)[0] == []
    assert queue.statistics().consumers == 1
    dispatches = queue.settle("low", [held.seq], Outcome.ACCEPTED, False)
    assert [(key, _body(m)) for key, m in dispatches] == [
        ("high", "m1"),
        ("high", "m2"),
        ("high", "m3"),
    ]
    # When it leaves, the highest priority among the others takes over.
    queue.attach("middle", ack_required=True, options=ConsumerOptions(priority=3))
    queue.detach("high", [])
    assert queue.credit("middle", 0, 5, False)[0] != []


def test_every_message_of_a_quorum_queue_is_persistent() -> None:
    queue = _queue()
    assert queue.persists(_message("transient"))


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        ({"durable": False}, "non-durable"),
        ({"exclusive": True}, "exclusive"),
        ({"auto_delete": True}, "auto-delete"),
    ],
)
def test_a_quorum_queue_is_durable_and_shared(flags: dict[str, bool], refused: str) -> None:
    with pytest.raises(PreconditionFailed, match=refused):
        QueueRegistry().declare_queue("qq", {"x-queue-type": "quorum"}, **flags)


def test_quorum_arguments_rabbitmq_takes() -> None:
    parsed = parse_arguments(
        {
            "x-queue-type": "quorum",
            "x-quorum-initial-group-size": 3,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-max-in-memory-length": 10,
        }
    )
    assert parsed.delivery_limit == 20
    assert parsed.dead_letter_strategy.value == "at-least-once"
    # at-least-once needs reject-publish: with drop-head it falls back, as in RabbitMQ.
    drop_head = parse_arguments(
        {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "d",
            "x-dead-letter-strategy": "at-least-once",
        }
    )
    assert drop_head.dead_letter_strategy.value == "at-most-once"
    with pytest.raises(PreconditionFailed, match="x-max-priority' for queue type quorum"):
        parse_arguments({"x-queue-type": "quorum", "x-max-priority": 5})
    with pytest.raises(PreconditionFailed, match="positive"):
        parse_arguments({"x-queue-type": "quorum", "x-quorum-initial-group-size": 0})


def test_at_least_once_dead_letters_are_sent_again_until_a_queue_takes_them() -> None:
    clock = Clock(1_000)
    registry = QueueRegistry(clock)
    queue = registry.declare_queue(
        "source",
        {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-max-length": 2,
        },
    )
    queue.enqueue(_message("first"))
    queue.attach("c", ack_required=True)
    (message,) = queue.credit("c", 0, 1, False)[0]
    queue.settle("c", [message.seq], Outcome.REJECTED, False)
    # The dead-letter exchange does not exist yet: the letter is kept, not dropped.
    assert registry.route_dead_letters() == []
    assert registry.dead_letter_router.dropped == 0
    # Kept letters count against the length limit: one kept and one ready fill it.
    queue.enqueue(_message("second"))
    with pytest.raises(ResourceLimitExceeded):
        queue.enqueue(_message("third"))
    registry.declare_exchange("dlx", "fanout")
    registry.declare_queue("dead")
    registry.bind("dlx", "dead")
    assert queue.next_deadline() == 1_000 + DEAD_LETTER_RETRY_MS
    clock.now = 1_000 + DEAD_LETTER_RETRY_MS
    registry.expire()
    registry.route_dead_letters()
    assert registry.queue("dead").statistics().ready == 1
    # Sent, it no longer counts: the source takes a message again.
    queue.enqueue(_message("third"))


def test_kept_dead_letters_count_in_the_held_bytes_and_are_sent_again_in_batches() -> None:
    clock = Clock(1_000)
    registry = QueueRegistry(clock)
    queue = registry.declare_queue(
        "source",
        {
            "x-queue-type": "quorum",
            "x-message-ttl": 10,
            "x-dead-letter-exchange": "missing",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
    )
    count = LETTERS_PER_PASS * 2
    for index in range(count):
        queue.enqueue(_message(str(index)))
    queued = registry.held.total
    clock.now += 10
    registry.expire()
    while registry.dead_letters:
        registry.route_dead_letters()
    held = registry.held.total
    # Every letter is kept, its message still counted, and the letter too.
    assert held == queued + count * KEPT_LETTER_OVERHEAD
    clock.now += DEAD_LETTER_RETRY_MS
    registry.expire()
    # Sent again, a pass at a time: never all of them in one call.
    passes = 0
    while registry.dead_letters:
        before = len(registry.dead_letters)
        registry.route_dead_letters()
        assert before - len(registry.dead_letters) <= LETTERS_PER_PASS
        passes += 1
    assert passes == 2
    # Kept again, counted again, no more and no less.
    assert registry.held.total == held
