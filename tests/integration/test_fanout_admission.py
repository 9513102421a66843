"""A message whose copies would take the publishers past their ceiling is released, not stored.

The copies of a fan-out are made at once, after the read that brought the message was charged:
what they cost beyond its payload (each copy's overhead, and the payload again for each copy
crossing to another worker) was charged then too, pausing the reads after it, but stored all
the same. A publisher whose credit was sized by light messages (a topic exchange's key bound
to one queue) could then send messages bound to a thousand queues, each 384 KB of copies, on
that credit: the adversary's seed 66100 took a worker 1.5 MB past its publishers' ceiling with
three such messages read together, where every publisher waits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Final

import proton
import pytest
from integration.conftest import RunningServer
from proton.utils import BlockingConnection, SendException

KiB: Final = 1024
MiB: Final = 1024 * KiB
WIDE: Final = 1_000
HEAVY: Final = 30


def _topic(running: RunningServer) -> None:
    registry = running.server.registry

    def declare() -> None:
        registry.declare_exchange("tx", "topic")
        registry.declare_queue("one")
        registry.bind("tx", "one", "one")
        for index in range(WIDE):
            registry.declare_queue(f"wide-{index}")
            registry.bind("tx", f"wide-{index}", "all")

    running.call(declare)


def _fill_until_held(running: RunningServer) -> None:
    connection = BlockingConnection(running.url, timeout=10)
    sender = connection.create_sender("/queues/nobody-reads")
    with contextlib.suppress(proton.Timeout, SendException):
        while True:
            sender.send(proton.Message(body=b"f" * 100_000), timeout=3)


def _send(link: proton.Link) -> proton.Delivery:
    """One message bound to every wide queue, not waiting for its outcome."""
    delivery = link.send(proton.Message(body=b"h" * 100, subject="all"))
    assert isinstance(delivery, proton.Delivery)
    return delivery


def test_a_fan_out_whose_copies_would_pass_the_ceiling_is_released(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=8 * MiB)
    _topic(running)
    budget = running.server.broker.publishing.budget
    publisher = BlockingConnection(running.url, timeout=10)
    sender = publisher.create_sender("/exchanges/tx")
    # Light messages first: the link's credit is sized by them.
    for _ in range(20):
        sender.send(proton.Message(body=b"l" * 100, subject="one"), timeout=5)
    _fill_until_held(running)
    assert running.call(lambda: budget.blocked)
    # Then messages bound to a thousand queues, on the credit it holds, not waiting for each.
    deliveries = [_send(sender.link) for _ in range(min(HEAVY, sender.link.credit))]
    assert len(deliveries) > 3, f"credit for only {len(deliveries)}"
    deadline = time.monotonic() + 30
    while not all(delivery.remote_state for delivery in deliveries):
        assert time.monotonic() < deadline, "outcomes missing"
        with contextlib.suppress(proton.Timeout):
            publisher.wait(lambda: False, timeout=0.2)
    level, ceiling = running.call(
        lambda: (budget.publishing_level(budget.current), budget.publishing_ceiling)
    )
    # Before: every one stored, 384 KB of copies each, the level megabytes past the ceiling.
    assert level < ceiling, f"publishers' level {level} past their ceiling {ceiling}"
    outcomes = [delivery.remote_state for delivery in deliveries]
    accepted = outcomes.count(proton.Delivery.ACCEPTED)
    assert outcomes.count(proton.Delivery.RELEASED) + accepted == len(deliveries)
    assert outcomes.count(proton.Delivery.RELEASED) > 0
    # What was accepted is in every queue, and nothing else: a release stored no copy.
    registry = running.server.registry

    def counts() -> set[int]:
        return {registry.queue(f"wide-{index}").statistics().ready for index in range(WIDE)}

    assert running.call(counts) == {accepted}


def test_a_fan_out_that_could_never_fit_is_rejected_with_the_reason(
    make_server: Callable[..., RunningServer],
) -> None:
    """3,100 copies cost 1.19 MB of overhead, more than a 1 MiB budget's publishers may hold
    at all (1.16 MB): released, the client would send it again for ever."""
    running = make_server(memory_budget=1 * MiB)
    registry = running.server.registry

    def declare() -> None:
        registry.declare_exchange("huge", "fanout")
        for index in range(3_100):
            registry.declare_queue(f"huge-{index}")
            registry.bind("huge", f"huge-{index}")

    running.call(declare)
    connection = BlockingConnection(running.url, timeout=10)
    sender = connection.create_sender("/exchanges/huge")
    with pytest.raises(SendException) as refused:
        sender.send(proton.Message(body=b"x"), timeout=5)
    assert refused.value.state == proton.Delivery.REJECTED
    assert running.call(lambda: registry.queue("huge-0").statistics().ready) == 0
    # The connection goes on.
    connection.create_sender("/queues/huge-1").send(proton.Message(body=b"y"), timeout=5)
    assert running.call(lambda: registry.queue("huge-1").statistics().ready) == 1
    connection.close()
