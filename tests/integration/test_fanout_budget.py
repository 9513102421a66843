"""A fan-out's payload counts once in the memory budget, and a browser's deliveries with it.

The adversary's runs of 2026-12-04 (docs/adversary.md) ended with the budget's count past its
ceiling, every publisher held, while RSS was 20 to 40 MiB over base: each queue of a fanout
counted its copy's payload in full though the copies share one ``bytes`` object, and a
browser's deliveries waiting in its session were counted on top of the queue's count of the
same messages (seed 64201). Copies now share a count of their holders (queues/held_bytes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

import pytest
from integration.conftest import RunningServer
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.state import ConnectionState
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD

KiB: Final = 1024
MiB: Final = 1024 * KiB
# The fan-out's width: 20 full copies of its messages would be far past the budget.
COPIES: Final = 20
# What a message's encoding adds to its body (sections' descriptors and sizes), at most.
FRAMING: Final = 1 * KiB


def _fanout(running: RunningServer, width: int) -> None:
    registry = running.server.registry

    def declare() -> None:
        registry.declare_exchange("fx", "fanout")
        for index in range(width):
            registry.declare_queue(f"fan-{index}")
            registry.bind("fx", f"fan-{index}")

    running.call(declare)


def test_a_fanouts_payload_counts_once_and_its_publisher_is_not_held(
    make_server: Callable[..., RunningServer],
) -> None:
    """Six 1 MB messages into a fanout of 20 queues under an 8 MiB budget: counted in full the
    first one alone (20 MB) would have blocked every publisher; counted once they take 6 MB
    and 120 copies' overhead, and the publisher is never held."""
    running = make_server(memory_budget=8 * MiB)
    _fanout(running, COPIES)
    broker = running.server.broker
    budget = broker.publishing.budget
    body = b"p" * 1_000_000
    assert publish(running.url, "/exchanges/fx", [body]).outcomes == ["accepted"]
    held = running.call(lambda: broker.registry.held.total)
    assert len(body) + COPIES * MESSAGE_OVERHEAD <= held
    assert held <= len(body) + FRAMING + COPIES * MESSAGE_OVERHEAD
    published = publish(running.url, "/exchanges/fx", [body] * 5)
    assert published.outcomes == ["accepted"] * 5
    held = running.call(lambda: broker.registry.held.total)
    assert held <= 6 * (len(body) + FRAMING + COPIES * MESSAGE_OVERHEAD)
    # The budget's own figure, as metrics and the console show it.
    wait_until(lambda: running.call(lambda: budget.current) >= held)
    assert running.call(lambda: budget.current) < budget.limit
    assert not running.call(lambda: budget.blocked)
    # Every queue lets go of its copies, in any order: the count is back at nothing.
    purged = running.call(
        lambda: [broker.registry.purge_queue(f"fan-{i}") for i in reversed(range(COPIES))]
    )
    assert purged == [6] * COPIES
    assert running.call(lambda: broker.registry.held.total) == 0


def _waiting_bytes(running: RunningServer, name: str) -> int:
    for state in running.server.broker.connections:
        assert isinstance(state, ConnectionState)
        if state.connection.remote_container == name:
            return state.waiting.statistics().bytes
    return 0


@pytest.mark.parametrize("mode", ["settled", "unsettled"])
def test_a_browsers_waiting_deliveries_share_their_queues_payload(
    make_server: Callable[..., RunningServer], mode: Literal["settled", "unsettled"]
) -> None:
    """Seed 64201: a browser with all the credit it may ask for, on a socket it never reads,
    over a queue of 6 MB. Its waiting deliveries are copies sharing the queue's payload: the
    count grows by their overhead only, and still counts what they hold once the queue drops
    its own (a purge), until they are gone with their connection. Settled mode is the seed's:
    its deliveries were counted in full on top of the queue's; an unsettled browser's were
    counted as the queue's, which a purge left counting nothing of what they held."""
    running = make_server(memory_budget=32 * MiB, writer_buffer_size=256 * KiB)
    broker = running.server.broker
    body = b"b" * (200 * KiB)
    count = 30
    assert publish(running.url, "/queues/browsed", [body] * count).outcomes == ["accepted"] * count

    def counted() -> int:
        return int(running.call(lambda: broker.registry.held.total + broker.outbound_bytes()))

    queued = counted()
    assert queued >= count * (len(body) + MESSAGE_OVERHEAD)
    client = RawClient.connect(running.host, running.port, container_id="browses", rcvbuf=16 * KiB)
    with client:
        client.begin(0)
        handle = client.attach(
            "browser",
            "receiver",
            source="/queues/browsed",
            distribution_mode="copy",
            snd_settle_mode=mode,
        )
        assert client.wait_attach(handle).error is None
        client.flow(handle, link_credit=2**32 - 1)
        # From now on nothing is read: what the writer cannot take waits in the session.
        taken = count * len(body) // 2
        wait_until(lambda: running.call(lambda: _waiting_bytes(running, "browses")) >= taken)
        waiting = running.call(lambda: _waiting_bytes(running, "browses"))
        # Counted once: the queue's messages, the deliveries' own cost, the writer's bytes.
        assert counted() < queued + waiting // 4 + 512 * KiB
        # The queue drops its messages; the deliveries waiting still hold their payloads.
        assert running.call(lambda: broker.registry.purge_queue("browsed")) == count
        assert running.call(lambda: broker.registry.held.total) >= taken
        client.reset()
    wait_until(lambda: running.call(broker.outbound_bytes) == 0)
    assert running.call(lambda: broker.registry.held.total) == 0


def test_a_presettled_consumers_waiting_messages_count_their_fanout_payload_once(
    make_server: Callable[..., RunningServer],
) -> None:
    """Seed 64301: a pre-settled consumer with all the credit it may ask for, on a socket it
    never reads, on one queue of a fanout. Its queue lets go of each message as it hands it
    out, but the fanout's other queue still counts the payload: the waiting messages count as
    one more holder of it, their overhead only, and keep it counted once that queue drops its
    copies, until they are gone with their connection (the unsent back in their queue)."""
    running = make_server(memory_budget=32 * MiB, writer_buffer_size=256 * KiB)
    _fanout(running, 2)
    broker = running.server.broker
    body = b"s" * (200 * KiB)
    count = 30
    published = publish(running.url, "/exchanges/fx", [body] * count)
    assert published.outcomes == ["accepted"] * count

    def counted() -> int:
        return int(running.call(lambda: broker.registry.held.total + broker.outbound_bytes()))

    queued = counted()
    assert queued <= count * (len(body) + FRAMING + 2 * MESSAGE_OVERHEAD)
    client = RawClient.connect(running.host, running.port, container_id="takes", rcvbuf=16 * KiB)
    with client:
        client.begin(0)
        handle = client.attach(
            "presettled", "receiver", source="/queues/fan-0", snd_settle_mode="settled"
        )
        assert client.wait_attach(handle).error is None
        client.flow(handle, link_credit=2**32 - 1)
        taken = count * len(body) // 2
        wait_until(lambda: running.call(lambda: _waiting_bytes(running, "takes")) >= taken)
        waiting = running.call(lambda: _waiting_bytes(running, "takes"))
        assert counted() < queued + waiting // 4 + 512 * KiB
        assert running.call(lambda: broker.registry.purge_queue("fan-1")) == count
        assert running.call(lambda: broker.registry.held.total) >= taken
        client.reset()
    wait_until(lambda: running.call(broker.outbound_bytes) == 0)
    running.call(lambda: broker.registry.purge_queue("fan-0"))
    assert running.call(lambda: broker.registry.held.total) == 0
