"""A deleted queue is freed as it is deleted, without a collection (issue 31, "memory goes
back"): its deadlines and its backlog referred back to it, so every deleted queue, a closed
connection's temporary ones among them, stayed a cycle with what it held until the collector
ran, which may be never on an idle server (gateway/collection.py)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import pytest
from support.collector import collector_off

from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.queues.registry import QueueRegistry

# Past every deadline the queues here set.
DAY = 86_400_000


@pytest.fixture
def no_collection() -> Iterator[None]:
    with collector_off():
        yield


@pytest.mark.usefixtures("no_collection")
@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"x-queue-type": "quorum"},
        {"x-message-ttl": 60_000, "x-dead-letter-exchange": "dlx"},
        {"x-max-priority": 5},
        {"x-consumer-timeout": 60_000},
    ],
    ids=["classic", "quorum", "ttl", "priority", "consumer-timeout"],
)
def test_a_deleted_queue_is_freed_without_a_collection(arguments: dict[str, object]) -> None:
    clock = Clock()
    registry = QueueRegistry(clock)
    durable = arguments.get("x-queue-type") == "quorum"
    queue = registry.declare_queue("q", arguments, durable=durable)
    for n in range(10):
        queue.enqueue(Message(b"m%d" % n))
    gone = weakref.ref(queue)
    del queue
    registry.delete_queue("q")
    # The timer's heap lets go of a deleted queue lazily, at its deadline (or as it is
    # compacted, queues/timed_queues.py).
    clock.now = DAY
    registry.expire()
    assert gone() is None
