"""Queue TTL (RabbitMQ's ``x-expires``): a queue unused for that long is deleted.

Unused means no consumer attached and no redeclaration; publishing does not count. Time is the
registry's clock, set by hand here.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluicegate.queues.arguments import MAX_EXPIRES, parse_arguments
from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

EXPIRES = 300
START = 1_000


def _message(text: str) -> Message:
    return Message(encode(Described(0x77, text)))


def _registry() -> tuple[QueueRegistry, Clock]:
    clock = Clock(START)
    return QueueRegistry(clock), clock


def test_x_expires_is_parsed_as_milliseconds() -> None:
    assert parse_arguments({"x-expires": 1}).expires == 1
    assert parse_arguments({"x-expires": MAX_EXPIRES}).expires == MAX_EXPIRES
    assert parse_arguments({}).expires is None


@pytest.mark.parametrize("value", [0, -1, MAX_EXPIRES + 1, "1000", 1.5, True, None])
def test_x_expires_must_be_a_positive_integer(value: object) -> None:
    """Unlike x-message-ttl it cannot be 0 (RabbitMQ's value_zero)."""
    with pytest.raises(PreconditionFailed, match="invalid arg 'x-expires'"):
        QueueRegistry().declare_queue("q", {"x-expires": value})


def test_streams_refuse_x_expires_as_rabbitmq_does() -> None:
    registry = QueueRegistry()
    with pytest.raises(PreconditionFailed, match="'x-expires' for queue type stream"):
        registry.declare_queue("s", {"x-queue-type": "stream", "x-expires": 1000})
    assert registry.get("s") is None


def test_an_unused_queue_is_deleted_at_its_deadline_not_before() -> None:
    registry, clock = _registry()
    registry.declare_queue("q", {"x-expires": EXPIRES})
    registry.declare_queue("forever")
    assert registry.next_deadline() == START + EXPIRES
    clock.now = START + EXPIRES - 1
    assert registry.expire_unused() == []
    assert registry.get("q") is not None
    clock.now = START + EXPIRES
    assert registry.expire_unused() == ["q"]
    assert registry.get("q") is None
    assert [info.name for info in registry.queues()] == ["forever"]
    assert registry.next_deadline() is None
    assert registry.expire_unused() == []


def test_publishing_is_not_use_and_the_messages_go_with_the_queue() -> None:
    """Messages of an expired queue are dropped, not dead-lettered; its bindings go too."""
    registry, clock = _registry()
    registry.declare_queue("dead")
    dead_letters = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    queue = registry.declare_queue("q", {"x-expires": EXPIRES, **dead_letters})
    registry.declare_exchange("events", "fanout")
    registry.bind("events", "q")
    for offset in (100, 200, 299):
        clock.now = START + offset
        for target in registry.route("events", ""):
            target.enqueue(_message(f"m{offset}"))
    assert queue.statistics().ready == 3
    clock.now = START + EXPIRES
    assert registry.expire_unused() == ["q"]
    assert registry.dead_letters == []
    assert registry.route_dead_letters() == []
    assert registry.queue("dead").statistics().ready == 0
    assert registry.bindings(destination="q") == []
    assert registry.route("events", "") == []
    assert registry.held.total == 0


def test_an_attached_consumer_keeps_the_queue_and_its_detach_restarts_the_countdown() -> None:
    registry, clock = _registry()
    queue = registry.declare_queue("q", {"x-expires": EXPIRES})
    clock.now = START + 100
    queue.attach("c", ack_required=True)
    clock.now = START + 10 * EXPIRES
    assert registry.expire_unused() == []
    assert registry.get("q") is queue
    # Found in use, its deadline moved on rather than staying in the past.
    assert registry.next_deadline() == clock.now + EXPIRES
    detached_at = clock.now = START + 20 * EXPIRES
    queue.detach("c", [])
    registry.consumer_left(queue)
    clock.now = detached_at + EXPIRES - 1
    assert registry.expire_unused() == []
    clock.now = detached_at + EXPIRES
    assert registry.expire_unused() == ["q"]


def test_a_consumer_that_came_and_went_between_checks_restarts_the_countdown() -> None:
    registry, clock = _registry()
    queue = registry.declare_queue("q", {"x-expires": EXPIRES})
    clock.now = START + 250
    queue.attach("c", ack_required=False)
    queue.detach("c", [])
    registry.consumer_left(queue)
    clock.now = START + 250 + EXPIRES - 1
    assert registry.expire_unused() == []
    clock.now = START + 250 + EXPIRES
    assert registry.expire_unused() == ["q"]


def test_a_redeclaration_renews_the_lease() -> None:
    registry, clock = _registry()
    queue = registry.declare_queue("q", {"x-expires": EXPIRES})
    clock.now = START + 200
    assert registry.declare_queue("q", {"x-expires": EXPIRES}) is queue
    clock.now = START + 200 + EXPIRES - 1
    assert registry.expire_unused() == []
    # An inequivalent redeclaration is refused, as for any argument.
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'x-expires'"):
        registry.declare_queue("q", {"x-expires": EXPIRES + 1})
    clock.now = START + 200 + EXPIRES
    assert registry.expire_unused() == ["q"]


def test_the_attach_path_does_not_renew_the_lease() -> None:
    """A publisher's attach finds the queue (registry.declare) without redeclaring it."""
    registry, clock = _registry()
    queue = registry.declare_queue("q", {"x-expires": EXPIRES})
    clock.now = START + 200
    assert registry.declare("q") is queue
    clock.now = START + EXPIRES
    assert registry.expire_unused() == ["q"]


def test_a_stale_queue_objects_detach_does_not_renew_its_successor() -> None:
    registry, clock = _registry()
    old = registry.declare_queue("q", {"x-expires": EXPIRES})
    old.attach("c", ack_required=True)
    registry.delete_queue("q")
    registry.declare_queue("q", {"x-expires": EXPIRES})
    clock.now = START + 200
    old.detach("c", [])
    registry.consumer_left(old)
    clock.now = START + EXPIRES
    assert registry.expire_unused() == ["q"]


def test_countdowns_restart_when_the_server_starts() -> None:
    """Queues declared before the server serves (recovered, configured) count from its start."""
    clock = Clock(0)
    registry = QueueRegistry(clock)
    registry.declare_queue("recovered", {"x-expires": EXPIRES})
    clock.now = 50_000
    registry.start_expiry_clocks()
    assert registry.next_deadline() == 50_000 + EXPIRES
    clock.now = 50_000 + EXPIRES - 1
    assert registry.expire_unused() == []
    clock.now = 50_000 + EXPIRES
    assert registry.expire_unused() == ["recovered"]


def test_each_queue_keeps_its_own_countdown() -> None:
    registry, clock = _registry()
    registry.declare_queue("short", {"x-expires": 100})
    registry.declare_queue("long", {"x-expires": 500})
    clock.now = START + 100
    assert registry.expire_unused() == ["short"]
    assert registry.next_deadline() == START + 500
    clock.now = START + 500
    assert registry.expire_unused() == ["long"]


class LeaseMachine(RuleBasedStateMachine):
    """Queues with x-expires against a model: consumers come and go, time passes, checks run.

    A queue goes exactly when a check runs at or after its last use plus x-expires while it has
    no consumer; a check that finds it in use counts as use.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(START)
        self.registry = QueueRegistry(self.clock)
        # The model: each live queue's x-expires, last use and attached consumers.
        self.expires: dict[str, int] = {}
        self.last_used: dict[str, int] = {}
        self.consumers: dict[str, set[int]] = {}
        self.next_consumer = 0

    names = st.sampled_from(["a", "b", "c"])

    @rule(name=names, expires=st.integers(1, 500))
    def declare(self, name: str, expires: int) -> None:
        if name in self.expires:
            expires = self.expires[name]
        self.registry.declare_queue(name, {"x-expires": expires})
        self.expires[name] = expires
        self.last_used[name] = self.clock.now
        self.consumers.setdefault(name, set())

    @rule(elapsed=st.integers(0, 600))
    def wait(self, elapsed: int) -> None:
        self.clock.now += elapsed

    @precondition(lambda self: bool(self.expires))
    @rule(data=st.data())
    def attach(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.expires)))
        self.next_consumer += 1
        self.registry.queue(name).attach(self.next_consumer, ack_required=True)
        self.consumers[name].add(self.next_consumer)

    @precondition(lambda self: any(self.consumers.values()))
    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, c in self.consumers.items() if c)))
        consumer = data.draw(st.sampled_from(sorted(self.consumers[name])))
        queue = self.registry.queue(name)
        queue.detach(consumer, [])
        self.registry.consumer_left(queue)
        self.consumers[name].discard(consumer)
        self.last_used[name] = self.clock.now

    @precondition(lambda self: bool(self.expires))
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.expires)))
        self.registry.queue(name).enqueue(_message("m"))

    @rule()
    def check(self) -> None:
        now = self.clock.now
        due = set()
        for name, expires in self.expires.items():
            if self.last_used[name] + expires <= now:
                if self.consumers[name]:
                    self.last_used[name] = now
                else:
                    due.add(name)
        assert set(self.registry.expire_unused()) == due
        for name in due:
            del self.expires[name], self.last_used[name], self.consumers[name]

    @invariant()
    def same_queues_and_deadline(self) -> None:
        assert {info.name for info in self.registry.queues()} == set(self.expires)
        deadlines = [self.last_used[n] + e for n, e in self.expires.items()]
        assert self.registry.next_deadline() == (min(deadlines) if deadlines else None)


LeaseMachine.TestCase.settings = settings(stateful_step_count=40)
test_lease_model = LeaseMachine.TestCase
