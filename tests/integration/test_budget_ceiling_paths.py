"""What the server stores without a publisher asking never takes the budget's count past its
ceiling (issue 31's seed 65600, docs/bounds.md).

Each test fills a small budget below its limit with a fan-out's copies, which share their
payload, then attacks one path that stores bytes no publisher's credit paid for: the copies
coming back unsettled with a failed delivery (a consumer's socket dropped), and their dead
letters (expired, or past their delivery limit) into one queue, each letter a new payload with
its death record. Before, each such copy got bytes of its own, and the count went to several
times the ceiling; now the count's peak, kept by the budget at every update, stays at most the
ceiling, and no message is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from integration.conftest import RunningServer
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.wire.sections import read_header

KiB: Final = 1024
MiB: Final = 1024 * KiB
BUDGET: Final = 4 * MiB
# The fan-out's width: its copies given a payload each would hold 8 times what it published.
WIDTH: Final = 8
# 30 messages of 100 KB: 3 MB shared by the 8 queues, within the budget; 24 MB unshared.
MESSAGES: Final = 30
BODY: Final = b"c" * 100_000


def _fanout(running: RunningServer, arguments: dict[str, object]) -> None:
    registry = running.server.registry

    def declare() -> None:
        registry.declare_exchange("cp-fan", "fanout")
        registry.declare_exchange("cp-dlx", "fanout")
        registry.declare_queue("cp-dlq", {})
        registry.bind("cp-dlx", "cp-dlq")
        for index in range(WIDTH):
            registry.declare_queue(f"cp-{index}", {"x-dead-letter-exchange": "cp-dlx"} | arguments)
            registry.bind("cp-fan", f"cp-{index}")

    running.call(declare)
    published = publish(running.url, "/exchanges/cp-fan", [BODY] * MESSAGES)
    assert published.outcomes == ["accepted"] * MESSAGES


def _take_and_drop(running: RunningServer, queue: str) -> int:
    """Take every message of ``queue`` unsettled, then drop the socket: how many came.

    The deliveries' bytes handed to proton count until written, on top of their queue's count
    of them until settled (docs/bounds.md): a pass that sends them all goes past the ceiling
    for as long as the socket takes them. The budget's peak is taken again once they are
    written, so that it measures what the drop stores."""
    with RawClient.connect("127.0.0.1", running.port) as attacker:
        attacker.begin()
        handle = attacker.attach("taker", "receiver", source=f"/queues/{queue}")
        attacker.flow(handle, link_credit=MESSAGES)
        taken = 0
        while taken < MESSAGES and attacker.next_message(10) is not None:
            taken += 1
        pending = running.server.broker.sending.pending_bytes
        wait_until(lambda: running.call(lambda: pending.total) == 0, 10)
        running.call(_restart_peak(running))
    return taken


def _restart_peak(running: RunningServer) -> Callable[[], None]:
    budget = running.server.broker.publishing.budget

    def restart() -> None:
        budget.peak = budget.used

    return restart


def _counts(running: RunningServer) -> tuple[list[int], int, int]:
    """Each fan-out queue's messages, the dead-letter queue's, and the letters waiting."""
    registry = running.server.registry

    def count(name: str) -> int:
        queue = registry.get(name)
        assert queue is not None
        statistics = queue.statistics()
        return statistics.ready + statistics.unacked

    def counts() -> tuple[list[int], int, int]:
        fans = [count(f"cp-{index}") for index in range(WIDTH)]
        return fans, count("cp-dlq"), len(registry.dead_letter_router.outbox)

    return running.call(counts)


def test_fanout_copies_coming_back_failed_keep_sharing_their_payload(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=BUDGET)
    _fanout(running, {})
    budget = running.server.broker.publishing.budget
    before = running.call(lambda: running.server.registry.held.total)
    taken = [_take_and_drop(running, f"cp-{index}") for index in range(WIDTH)]
    assert taken == [MESSAGES] * WIDTH
    wait_until(lambda: _counts(running)[0] == [MESSAGES] * WIDTH, 10)
    # Every copy is back with a failed delivery, its payload still shared: nothing grew.
    assert running.call(lambda: running.server.registry.held.total) == before
    assert running.call(lambda: budget.peak) <= budget.ceiling
    # The next consumer sees the failure in the header (AMQP 1.0's delivery-count).
    consumer = RawClient.connect("127.0.0.1", running.port)
    consumer.begin()
    handle = consumer.attach("again", "receiver", source="/queues/cp-0")
    consumer.flow(handle, link_credit=1)
    got = consumer.next_message(10)
    assert got is not None
    assert read_header(got.payload).delivery_count == 1
    consumer.close()


def test_expired_fanout_copies_dead_lettered_to_one_queue_wait_for_room(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=BUDGET)
    _fanout(running, {"x-message-ttl": 200})
    budget = running.server.broker.publishing.budget
    # Every copy expires: 240 letters, each a payload of its own in the one dead-letter queue.
    wait_until(lambda: sum(_counts(running)[0]) < WIDTH * MESSAGES, 10)
    wait_until(lambda: running.call(lambda: running.server.registry.dead_letter_router.waiting), 10)
    fans, stored, waiting = _counts(running)
    assert running.call(lambda: budget.peak) <= budget.ceiling
    # Letters take none of the margin (MemoryBudget.room): it is the publishers'.
    assert running.call(lambda: running.server.registry.held.total) <= BUDGET
    # None lost: each copy is in the dead-letter queue, or waits in its queue as a letter,
    # or has not expired yet.
    assert 0 < stored < WIDTH * MESSAGES
    assert waiting > 0
    assert sum(fans) + waiting + stored == WIDTH * MESSAGES


def test_delivery_limit_letters_of_fanout_copies_wait_for_room(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(memory_budget=BUDGET)
    _fanout(running, {"x-delivery-limit": 0})
    budget = running.server.broker.publishing.budget
    taken = [_take_and_drop(running, f"cp-{index}") for index in range(WIDTH)]
    assert taken == [MESSAGES] * WIDTH
    wait_until(lambda: running.call(lambda: running.server.registry.dead_letter_router.waiting), 10)
    fans, stored, waiting = _counts(running)
    assert running.call(lambda: budget.peak) <= budget.ceiling
    # Letters take none of the margin (MemoryBudget.room): it is the publishers'.
    assert running.call(lambda: running.server.registry.held.total) <= BUDGET
    assert 0 < stored < WIDTH * MESSAGES
    assert waiting > 0
    assert sum(fans) + waiting + stored == WIDTH * MESSAGES
