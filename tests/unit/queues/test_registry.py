"""The registry: declarations (idempotent, inequivalent ones refused), bindings and routing."""

from __future__ import annotations

import pytest
from support.deaths import deaths_of

from sluicegate.queues.arguments import Overflow, parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.errors import (
    NotFound,
    NotImplementedByServer,
    PreconditionFailed,
    ResourceLocked,
)
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Outcome, QueueType
from sluicegate.queues.registry import AccessRefused, QueueRegistry
from sluicegate.queues.topic_trie import TopicTrie
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import MESSAGE_ANNOTATIONS, sections


def _body(text: str) -> bytes:
    return encode(Described(0x77, text))


def test_declare_queue_is_idempotent_and_refuses_inequivalent_arguments() -> None:
    registry = QueueRegistry()
    queue = registry.declare_queue("q", {"x-max-length": 10})
    assert registry.declare_queue("q", {"x-max-length": 10}) is queue
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'x-max-length'"):
        registry.declare_queue("q", {"x-max-length": 11})
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'durable'"):
        registry.declare_queue("q", {"x-max-length": 10}, durable=False)
    # The attach path takes the queue as it is.
    assert registry.declare("q") is queue
    assert [info.name for info in registry.queues()] == ["q"]


def test_exclusive_queue_belongs_to_its_owner() -> None:
    registry = QueueRegistry()
    owner, other = object(), object()
    registry.declare_queue("q", exclusive=True, owner=owner)
    registry.declare_queue("q", exclusive=True, owner=owner)
    with pytest.raises(ResourceLocked):
        registry.declare_queue("q", exclusive=True, owner=other)


@pytest.mark.parametrize(
    ("arguments", "error", "named"),
    [
        ({"x-max-length": -1}, PreconditionFailed, "x-max-length"),
        ({"x-message-ttl": "soon"}, PreconditionFailed, "x-message-ttl"),
        ({"x-overflow": "explode"}, PreconditionFailed, "x-overflow"),
        ({"x-single-active-consumer": 1}, PreconditionFailed, "x-single-active-consumer"),
        ({"x-dead-letter-routing-key": "k"}, PreconditionFailed, "x-dead-letter-routing-key"),
        ({"x-max-priority": 0}, PreconditionFailed, "x-max-priority"),
        ({"x-max-priority": 256}, PreconditionFailed, "x-max-priority"),
        ({"x-max-priority": True}, PreconditionFailed, "x-max-priority"),
        (
            {"x-max-priority": 10, "x-queue-type": "stream"},
            PreconditionFailed,
            "x-max-priority",
        ),
        ({"x-queue-mode": "lazy"}, NotImplementedByServer, "x-queue-mode"),
        ({"x-queue-mode": "eager"}, PreconditionFailed, "x-queue-mode"),
        ({"x-queue-type": "jms"}, NotImplementedByServer, "x-queue-type"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    arguments: dict[str, object], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        QueueRegistry().declare_queue("q", arguments)


def test_arguments_parse_rabbitmq_names() -> None:
    parsed = parse_arguments(
        {
            "x-message-ttl": 100,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "dead",
            "x-max-length": 5,
            "x-overflow": "reject-publish",
            "x-delivery-limit": 3,
            "x-single-active-consumer": True,
            "x-consumer-timeout": 30000,
        }
    )
    assert (parsed.message_ttl, parsed.dead_letter_exchange, parsed.dead_letter_routing_key) == (
        100,
        "dlx",
        "dead",
    )
    assert (parsed.max_length, parsed.overflow, parsed.delivery_limit) == (
        5,
        Overflow.REJECT_PUBLISH,
        3,
    )
    assert parsed.single_active_consumer
    assert parsed.consumer_timeout == 30000


@pytest.mark.parametrize(
    ("binding_key", "routing_key", "matches"),
    [
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.*.c", "a.b.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#.c", "a.b.c", True),
        ("#", "", True),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.x.y.c", True),
        ("a.#.c", "a.x.y.d", False),
        ("*", "a.b", False),
        ("a.b", "a.b", True),
        ("#.#.b", "b", True),
    ],
)
def test_topic_matching(binding_key: str, routing_key: str, matches: bool) -> None:
    trie = TopicTrie()
    trie.add(binding_key)
    assert trie.match(routing_key) == ([binding_key] if matches else [])


def names(queues: list[QueueType]) -> list[str]:
    return sorted(q.name for q in queues)


def test_exchanges_route_to_bound_queues() -> None:
    registry = QueueRegistry()
    for name in ("q1", "q2", "q3"):
        registry.declare_queue(name)
    registry.declare_exchange("t", "topic")
    registry.declare_exchange("f", "fanout")
    registry.declare_exchange("d", "direct")
    registry.bind("t", "q1", "a.*.c")
    registry.bind("t", "q2", "a.#")
    registry.bind("f", "q1")
    registry.bind("f", "q3")
    registry.bind("d", "q2", "k")
    assert names(registry.route("t", "a.b.c")) == ["q1", "q2"]
    assert names(registry.route("t", "a.b")) == ["q2"]
    assert names(registry.route("t", "b")) == []
    assert names(registry.route("f", "anything")) == ["q1", "q3"]
    assert names(registry.route("d", "k")) == ["q2"]
    assert names(registry.route("d", "other")) == []
    assert names(registry.route("", "q3")) == ["q3"]
    assert names(registry.route("amq.direct", "q3")) == []
    with pytest.raises(NotFound):
        registry.route("missing", "k")
    assert len(registry.bindings(source="t")) == 2
    assert registry.unbind("t", "q1", "a.*.c")
    assert names(registry.route("t", "a.b.c")) == ["q2"]
    # Deleting a queue removes its bindings.
    registry.delete_queue("q1")
    assert names(registry.route("f", "x")) == ["q3"]
    assert all(b.destination != "q1" for b in registry.bindings())


def test_exchange_declarations() -> None:
    registry = QueueRegistry()
    registry.declare_exchange("e", "topic")
    registry.declare_exchange("e", "topic")
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'type'"):
        registry.declare_exchange("e", "fanout")
    with pytest.raises(AccessRefused):
        registry.declare_exchange("amq.mine", "direct")
    with pytest.raises(AccessRefused):
        registry.delete_exchange("amq.topic")
    with pytest.raises(PreconditionFailed, match="invalid exchange type"):
        registry.declare_exchange("h", "x-no-such-plugin")
    with pytest.raises(NotFound):
        registry.bind("e", "no-such-queue", "k")
    registry.declare_queue("q")
    registry.bind("e", "q", "k")
    with pytest.raises(PreconditionFailed):
        registry.delete_exchange("e", if_unused=True)
    registry.delete_exchange("e")
    assert "e" not in [e.name for e in registry.exchanges()]


def test_an_auto_delete_exchange_goes_with_its_last_binding() -> None:
    """RabbitMQ's rule: deleted when its last binding goes, by unbind or by queue deletion."""
    registry = QueueRegistry()
    for name in ("q1", "q2"):
        registry.declare_queue(name)
    registry.declare_exchange("by-unbind", "direct", auto_delete=True)
    registry.declare_exchange("by-delete", "fanout", auto_delete=True)
    registry.declare_exchange("kept", "fanout")
    registry.declare_exchange("never-bound", "fanout", auto_delete=True)
    registry.bind("by-unbind", "q1", "a")
    registry.bind("by-unbind", "q2", "b")
    registry.bind("by-delete", "q2")
    registry.bind("kept", "q2")

    def names() -> list[str]:
        return [e.name for e in registry.exchanges() if not e.name.startswith("amq.")]

    assert registry.unbind("by-unbind", "q1", "a")
    assert "by-unbind" in names()
    assert registry.unbind("by-unbind", "q2", "b")
    assert "by-unbind" not in names()
    registry.delete_queue("q2")
    assert names() == ["kept", "never-bound"]


def test_alternate_exchange_takes_unroutable_messages() -> None:
    registry = QueueRegistry()
    registry.declare_queue("lost")
    registry.declare_exchange("ae", "fanout")
    registry.bind("ae", "lost")
    registry.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    assert [q.name for q in registry.route("main", "nobody")] == ["lost"]


def test_delete_and_purge() -> None:
    registry = QueueRegistry()
    queue = registry.declare_queue("q")
    queue.enqueue(Message(_body("a")))
    queue.enqueue(Message(_body("b")))
    with pytest.raises(PreconditionFailed):
        registry.delete_queue("q", if_empty=True)
    assert registry.purge_queue("q") == 2
    assert registry.delete_queue("q") == 0
    assert registry.get("q") is None
    assert registry.delete_queue("q") == 0
    with pytest.raises(NotFound):
        registry.purge_queue("q")


def test_rejected_message_is_dead_lettered_with_its_death_annotated() -> None:
    clock = Clock(1_000)
    registry = QueueRegistry(clock)
    registry.declare_queue("dlq")
    registry.declare_exchange("dlx", "fanout")
    registry.bind("dlx", "dlq")
    work = registry.declare_queue("work", {"x-dead-letter-exchange": "dlx"})
    body = _body("poison")
    work.enqueue(Message(body, routing_key="work"))
    work.attach("c", ack_required=True)
    work.credit("c", 0, 1, False)
    work.settle("c", [0], Outcome.REJECTED, False)
    assert registry.route_dead_letters() == []
    dlq = registry.queue("dlq")
    dlq.attach("d", ack_required=True)
    [dead], _ = dlq.credit("d", 0, 1, False)
    # The body's bytes are untouched, after a new message-annotations section.
    assert dead.payload.endswith(body)
    [(code, annotations, _, _)] = sections(dead.payload)
    assert code == MESSAGE_ANNOTATIONS
    assert isinstance(annotations, dict)
    assert annotations[Symbol("x-first-death-reason")] == "rejected"
    assert annotations[Symbol("x-first-death-queue")] == "work"
    [death] = deaths_of(dead.payload)
    assert death[Symbol("count")] == 1
    assert death[Symbol("queue")] == "work"
    assert death[Symbol("routing-keys")] == ["work"]
    assert work.statistics().dead_lettered == 1


def test_expiry_cycle_is_dropped() -> None:
    # Two queues dead-lettering expired messages to each other: RabbitMQ drops the loop.
    clock = Clock(0)
    registry = QueueRegistry(clock)
    a = registry.declare_queue(
        "a", {"x-message-ttl": 10, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"}
    )
    registry.declare_queue(
        "b", {"x-message-ttl": 10, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"}
    )
    a.enqueue(Message(_body("x")))
    for step in range(1, 5):
        clock.now = step * 20
        registry.expire()
        registry.route_dead_letters()
    assert registry.dead_letter_router.dropped == 1
    assert sum(s.ready for s in registry.statistics()) == 0


def test_a_second_death_in_the_same_queue_counts_up_most_recent_first() -> None:
    clock = Clock(1_000)
    registry = QueueRegistry(clock)
    registry.declare_queue(
        "retry", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"}
    )
    work = registry.declare_queue(
        "work", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "retry"}
    )
    retry = registry.queue("retry")
    work.enqueue(Message(_body("m"), routing_key="work"))
    work.attach("c", ack_required=True)
    retry.attach("r", ack_required=True)
    delivery_counts = {"c": 0, "r": 0}
    # work rejects to retry, retry rejects back to work, work rejects again.
    for queue, key in ((work, "c"), (retry, "r"), (work, "c")):
        [message], reply = queue.credit(key, delivery_counts[key], 1, False)
        assert reply is not None
        delivery_counts[key] = reply.delivery_count
        queue.settle(key, [message.seq], Outcome.REJECTED, False)
        clock.now += 10
        registry.route_dead_letters()
    [dead], _ = retry.credit("r", delivery_counts["r"], 1, False)
    deaths = deaths_of(dead.payload)
    assert [(d[Symbol("queue")], d[Symbol("count")]) for d in deaths] == [("work", 2), ("retry", 1)]
    assert deaths[0][Symbol("first-time")] == 1_010
    assert deaths[0][Symbol("last-time")] == 1_030


def test_the_timer_visits_only_queues_with_deadlines() -> None:
    clock = Clock(0)
    registry = QueueRegistry(clock)
    idle = registry.declare_queue("idle")
    timed = registry.declare_queue("timed", {"x-message-ttl": 100})
    idle.enqueue(Message(_body("a")))
    timed.enqueue(Message(_body("b")))
    assert set(registry.timed) == {timed}
    assert registry.next_deadline() == 100
    clock.now = 100
    assert registry.expire() == []
    assert timed.statistics().expired == 1
    assert set(registry.timed) == set()
    assert registry.next_deadline() is None


def test_a_tick_reads_only_the_queues_due_however_many_are_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 queues each with a message of a day's TTL: the timer read every one's next
    deadline twice a tick, 20 times a second, some 40 % of the reactor. Now a tick reads the
    queues due and the earliest deadline only."""
    clock = Clock(0)
    registry = QueueRegistry(clock)
    far = [registry.declare_queue(f"far-{n}", {"x-message-ttl": 86_400_000}) for n in range(2_000)]
    for queue in far:
        queue.enqueue(Message(_body("a")))
    near = registry.declare_queue("near", {"x-message-ttl": 100})
    near.enqueue(Message(_body("b")))
    read: list[str] = []
    next_deadline = ClassicQueue.next_deadline

    def counted(queue: ClassicQueue) -> int | None:
        read.append(queue.name)
        return next_deadline(queue)

    monkeypatch.setattr(ClassicQueue, "next_deadline", counted)
    assert registry.next_deadline() == 100
    clock.now = 50
    assert registry.expire() == []
    assert read == []
    clock.now = 100
    assert registry.expire() == []
    assert near.statistics().expired == 1
    assert read == ["near"], "read once to be timed again from its next deadline: none"
    assert registry.next_deadline() == 86_400_000
    assert len(registry.timed) == 2_000
    # A message that expires sooner times its queue from then.
    far[7].enqueue(Message(_body("c"), expires=1_000))
    assert registry.next_deadline() == 1_000
    clock.now = 1_000
    registry.expire()
    assert far[7].statistics().expired == 1
    assert far[7].statistics().ready == 1


def test_the_default_queue_mode_is_kept_and_changes_nothing() -> None:
    # RabbitMQ's JavaScript client sends x-queue-mode "default" for a classic queue's mode.
    assert parse_arguments({"x-queue-mode": "default"}).extra == (("x-queue-mode", "default"),)


def test_a_consistent_hash_exchange_spreads_keys_by_weight_and_keeps_them() -> None:
    registry = QueueRegistry()
    registry.declare_exchange("h", "x-consistent-hash")
    for name, weight in (("light", "1"), ("heavy", "3")):
        registry.declare_queue(name)
        registry.bind("h", name, weight)
    keys = [f"order-{n}" for n in range(4000)]
    first = {key: [q.name for q in registry.route("h", key)] for key in keys}
    assert all(len(names) == 1 for names in first.values())
    heavy = sum(names == ["heavy"] for names in first.values())
    assert 2400 < heavy < 3600
    # The same key goes to the same queue; a new queue takes keys only for itself.
    assert first == {key: [q.name for q in registry.route("h", key)] for key in keys}
    registry.declare_queue("new")
    registry.bind("h", "new", "2")
    moved = {key for key in keys if [q.name for q in registry.route("h", key)] != first[key]}
    assert moved
    assert all([q.name for q in registry.route("h", key)] == ["new"] for key in moved)


@pytest.mark.parametrize(
    ("key", "match"),
    [("0", "positive"), ("x", "positive"), ("\u0661", "positive"), ("1001", "1000")],
)
def test_a_consistent_hash_binding_key_is_a_bounded_weight(key: str, match: str) -> None:
    registry = QueueRegistry()
    registry.declare_exchange("h", "x-consistent-hash")
    registry.declare_queue("q")
    with pytest.raises(PreconditionFailed, match=match):
        registry.bind("h", "q", key)


def test_a_consistent_hash_ring_is_bounded_and_binds_queues_only() -> None:
    registry = QueueRegistry()
    registry.declare_exchange("h", "x-consistent-hash")
    registry.declare_exchange("other", "fanout")
    for n in range(20):
        registry.declare_queue(f"q{n}")
        registry.bind("h", f"q{n}", "1000")
    registry.declare_queue("one-more")
    with pytest.raises(PreconditionFailed, match="20000 points"):
        registry.bind("h", "one-more", "1")
    with pytest.raises(PreconditionFailed, match="queues only"):
        registry.bind("h", "other", "1", to_exchange=True)
