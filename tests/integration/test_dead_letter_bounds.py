"""Dead-letter loops, fan-outs and auto-delete cascades a client builds stay bounded (issue 31).

Each attack runs against a real server while a prober (another client, a new connection each
round) keeps being served. Before the fixes a TTL-0 loop after one rejection held the reactor
for ever, a fan-out reject loop grew the held bytes far past the memory budget, and a chain of
1,500 auto-delete exchanges hit RecursionError half-way, from the expiry timer, which then
stopped for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Event, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection
from support.flood import Flood
from support.polling import wait_until
from support.prober import Prober

from sluicegate.gateway.events import delivery_of

# Alone under xdist (docs/testing.md): its probers bound latencies (SERVED).
pytestmark = pytest.mark.alone

# A served prober's round takes well under a second, even on a loaded machine; the attacks
# held the reactor for good.
SERVED: Final = 5.0


def _served(prober: Prober) -> None:
    seen = prober.seen
    assert seen.failures == []
    assert seen.rounds, "the prober did not get through one round"
    assert seen.worst < SERVED


def test_a_ttl_0_loop_after_one_rejection_is_dropped_while_others_are_served(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server()
    registry = running.server.registry

    def declare() -> None:
        for name, other in (("dl-a", "dl-b"), ("dl-b", "dl-a")):
            registry.declare_queue(
                name,
                {
                    "x-message-ttl": 0,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": other,
                },
            )

    running.call(declare)
    with Prober(running.url) as prober:
        connection = BlockingConnection(running.url, timeout=10)
        receiver = connection.create_receiver("/queues/dl-b", credit=1)
        connection.create_sender("/queues/dl-b").send(Message(body="once"))
        receiver.receive(10)
        receiver.reject()
        # Rejected in dl-b, expired at once in dl-a, back in dl-b: a rejection lies inside
        # that loop, so it goes on, to the consumer again.
        receiver.receive(10)
        # Released with no consumer left: dl-b expires it, and back in dl-a it would close a
        # loop of expiries only (dl-a, then dl-b): it is dropped.
        receiver.close()  # type: ignore[no-untyped-call]
        wait_until(lambda: running.call(lambda: registry.dead_letter_router.dropped) == 1)
        counted = running.call(
            lambda: [registry.queue(q).statistics().dead_lettered for q in ("dl-a", "dl-b")]
        )
        prober.wait_rounds(len(prober.seen.rounds) + 3, timeout=30)
        connection.close()
    assert counted == [1, 2]
    assert running.call(
        lambda: [registry.queue(q).statistics().dead_lettered for q in ("dl-a", "dl-b")]
    ) == [1, 2]
    assert running.call(lambda: sum(s.ready + s.unacked for s in registry.statistics())) == 0
    _served(prober)


class _Rejecter(MessagingHandler):
    """Rejects every message of its queues, as fast as they come."""

    def __init__(self, url: str, queues: tuple[str, ...]) -> None:
        super().__init__(prefetch=100, auto_accept=False)
        self.url = url
        self.queues = queues
        self.rejected = 0
        self.stopping = threading.Event()

    def on_start(self, event: Event) -> None:
        connection = event.container.connect(self.url)
        for queue in self.queues:
            event.container.create_receiver(connection, f"/queues/{queue}")
        event.container.schedule(0.05, self)

    def on_timer_task(self, event: Event) -> None:
        if self.stopping.is_set():
            event.container.stop()
        else:
            event.container.schedule(0.05, self)

    def on_message(self, event: Event) -> None:
        self.reject(delivery_of(event))
        self.rejected += 1


@pytest.mark.slow
def test_a_reject_loop_doubling_through_a_fanout_stays_within_the_budget(
    make_server: Callable[..., RunningServer],
) -> None:
    # Two queues dead-letter into a fanout exchange bound to both: each rejection makes two
    # copies of the message. Before, the held bytes grew as fast as the consumer rejected
    # (1,010 MiB counted against a 64 MiB budget after 40 s).
    budget = 8 * 1024 * 1024
    running = make_server(memory_budget=budget)
    registry = running.server.registry
    body = "x" * 32_000

    def declare() -> None:
        registry.declare_exchange("dl-fan", "fanout")
        for name in ("dl-q1", "dl-q2"):
            registry.declare_queue(name, {"x-dead-letter-exchange": "dl-fan"})
            registry.bind("dl-fan", name)

    running.call(declare)
    # Another client's messages, published before the attack, consumed while it runs: with
    # the budget full, publishers wait (docs/inbound-flow-control.md), consumers never do.
    seeder = BlockingConnection(running.url, timeout=10)
    sender = seeder.create_sender("/queues/dl-other")
    for index in range(20):
        sender.send(Message(body=index))
    seeder.close()
    rejecter = _Rejecter(running.url, ("dl-q1", "dl-q2"))
    thread = threading.Thread(target=Container(rejecter).run, daemon=True)
    thread.start()
    held: list[int] = []
    try:
        publisher = BlockingConnection(running.url, timeout=10)
        publisher.create_sender("/queues/dl-q1").send(Message(body=body))
        publisher.close()
        # The copies reach the budget (8 MiB is ~250 messages of 32 KB) and then wait.
        wait_until(lambda: running.call(lambda: registry.dead_letter_router.waiting), 60)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            held.append(running.call(lambda: registry.held.total))
            time.sleep(0.1)
        waiting = running.call(lambda: len(registry.dead_letters))
        rejected = rejecter.rejected
        started = time.monotonic()
        other = BlockingConnection(running.url, timeout=10)
        receiver = other.create_receiver("/queues/dl-other", credit=20)
        bodies = []
        for _ in range(20):
            bodies.append(receiver.receive(SERVED).body)
            receiver.accept()
        served = time.monotonic() - started
        other.close()
        time.sleep(1)
        assert rejecter.rejected == rejected, "the rejections went on past the budget"
    finally:
        rejecter.stopping.set()
        thread.join(10)
    # What the copies hold never passes the budget: the letters wait, their messages counted.
    assert max(held) <= budget
    assert waiting > 0
    assert bodies == list(range(20))
    assert served < SERVED


@pytest.mark.slow
def test_a_publisher_whose_messages_overflow_into_a_fanout_is_held_others_publish_on(
    make_server: Callable[..., RunningServer],
) -> None:
    # x-max-length 0 gives every message up at once to a fanout bound to ten queues nobody
    # consumes: the publisher's queue stays empty while its dead letters wait for the budget.
    # Before, it was weighed by its queue's ready bytes (none), so it went on through the
    # margin meant for others up to the ceiling, where every publisher waits: the prober
    # (another client publishing to its own queue) was held for good (seed 61003).
    budget = 8 * 1024 * 1024
    running = make_server(memory_budget=budget)
    registry = running.server.registry
    memory = running.server.broker.publishing.budget
    sinks = [f"dl-sink{index}" for index in range(10)]

    def declare() -> None:
        registry.declare_exchange("dl-spread", "fanout")
        for name in sinks:
            registry.declare_queue(name)
            registry.bind("dl-spread", name)
        registry.declare_queue(
            "dl-full", {"x-max-length": 0, "x-dead-letter-exchange": "dl-spread"}
        )

    running.call(declare)
    flood = Flood(running.url, ["/queues/dl-full"], body_size=300_000)
    flood.start()
    try:
        # Held by its weight once the budget blocks, or by its letters waiting for room, as
        # the margin's parts fall (docs/inbound-flow-control.md): either way the budget blocks.
        wait_until(lambda: running.call(lambda: memory.blocked), 60)
        # The flood is held: what it sent stops growing.
        sent = -1
        while sent != flood.sent:
            sent = flood.sent
            time.sleep(1.0)
        with Prober(running.url) as prober:
            prober.wait_rounds(5, timeout=60)
        used = running.call(lambda: memory.current)
        ceiling = memory.ceiling
        assert flood.sent == sent, "the flood went on while held"
    finally:
        flood.stopping.set()
    _served(prober)
    assert used <= ceiling


def test_a_1500_exchange_auto_delete_cascade_goes_with_its_queue_and_timers_go_on(
    make_server: Callable[..., RunningServer],
) -> None:
    # The queue at the end of the chain expires (x-expires): the cascade runs from the expiry
    # timer, which died of RecursionError half-way before, and no TTL ran again.
    running = make_server()
    registry = running.server.registry
    length = 1_500

    def declare() -> None:
        registry.declare_queue("dl-end", {"x-expires": 200})
        for index in range(length):
            registry.declare_exchange(f"dl-x{index}", "fanout", auto_delete=True)
        for index in range(length - 1):
            registry.bind(f"dl-x{index}", f"dl-x{index + 1}", to_exchange=True)
        registry.bind(f"dl-x{length - 1}", "dl-end")
        registry.declare_queue("dl-dead")
        registry.declare_queue(
            "dl-ttl",
            {
                "x-message-ttl": 100,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dl-dead",
            },
        )

    running.call(declare)
    with Prober(running.url) as prober:
        wait_until(lambda: running.call(lambda: registry.exchange_count) == 0, 30)
        assert running.call(lambda: registry.binding_count) == 0
        # The timer goes on: a message past its TTL reaches the dead-letter queue.
        connection = BlockingConnection(running.url, timeout=10)
        connection.create_sender("/queues/dl-ttl").send(Message(body="late"))
        received = connection.create_receiver("/queues/dl-dead", credit=1).receive(10)
        connection.close()
        prober.wait_rounds(len(prober.seen.rounds) + 3, timeout=30)
    assert received.body == "late"
    _served(prober)
