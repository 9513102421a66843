"""Queue and exchange arguments as RabbitMQ 4.2 takes them, type by type."""

from __future__ import annotations

from collections import Counter

import pytest

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.registry import QueueRegistry


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        # Each queue type takes its own arguments; another type's are refused, by name.
        ({"x-max-age": "1h"}, "x-max-age' for queue type classic"),
        ({"x-dead-letter-strategy": "at-most-once"}, "x-dead-letter-strategy' for queue type"),
        ({"x-queue-type": "stream", "x-max-length": 10}, "x-max-length' for queue type stream"),
        ({"x-queue-type": "stream", "x-expires": 1000}, "x-expires' for queue type stream"),
        ({"x-queue-type": "stream", "x-stream-filter-size-bytes": 8}, "16 to 255"),
        ({"x-queue-type": "stream", "x-stream-filter-size-bytes": "big"}, "non-negative"),
        ({"x-queue-type": "stream", "x-initial-cluster-size": 0}, "positive"),
        ({"x-queue-leader-locator": "nearest"}, "unknown locator"),
    ],
)
def test_arguments_of_another_queue_type_or_bad_values_are_refused(
    arguments: dict[str, object], named: str
) -> None:
    with pytest.raises(PreconditionFailed, match=named):
        parse_arguments(arguments)


def test_stream_arguments_rabbitmq_takes_are_kept_and_reported() -> None:
    registry = QueueRegistry()
    arguments = {
        "x-queue-type": "stream",
        "x-stream-filter-size-bytes": 32,
        "x-stream-max-segment-size-bytes": 1_000_000,
        "x-initial-cluster-size": 3,
        "x-queue-leader-locator": "balanced",
    }
    registry.declare_queue("s", arguments)
    assert dict(registry.settings("s").raw_arguments) == arguments
    # The same declaration again is equivalent.
    registry.declare_queue("s", dict(arguments))


def test_an_exchange_keeps_arguments_it_does_not_know_and_compares_only_its_own() -> None:
    registry = QueueRegistry()
    registry.declare_exchange("e", "topic", arguments={"test": "value", "x-custom": 1})
    exchange = registry.exchange("e")
    assert dict(exchange.settings.arguments) == {"test": "value", "x-custom": 1}
    # RabbitMQ compares only alternate-exchange when an exchange is declared again.
    registry.declare_exchange("e", "topic", arguments={"test": "other"})
    with pytest.raises(PreconditionFailed, match="alternate_exchange"):
        registry.declare_exchange("e", "topic", arguments={"alternate-exchange": "ae"})


def test_x_local_random_routes_each_message_to_one_bound_queue() -> None:
    registry = QueueRegistry()
    registry.declare_exchange("spread", "x-local-random")
    assert registry.route("spread", "any") == []
    for name in ("a", "b", "c"):
        registry.declare_queue(name)
        registry.bind("spread", name)
    picked = Counter(q.name for _ in range(300) for q in registry.route("spread", "k"))
    assert sum(picked.values()) == 300
    # Random, so every queue gets some: the chance that one of three gets none is 3 * (2/3)^300.
    assert set(picked) == {"a", "b", "c"}


def test_x_local_random_picks_among_its_queues_without_listing_them_per_message() -> None:
    """Before, each message listed every bound queue to pick one: O(bindings) a message. The
    list is made once per change of the bindings, and a new binding is picked from."""
    registry = QueueRegistry()
    registry.declare_exchange("spread", "x-local-random")
    names = [f"q{n}" for n in range(1_000)]
    for name in names:
        registry.declare_queue(name)
        registry.bind("spread", name)
    routes = registry.exchange("spread")._queues
    picked = {q.name for _ in range(200) for q in registry.route("spread", "k")}
    picks = routes.picks
    assert picks is not None
    picked |= {q.name for _ in range(200) for q in registry.route("spread", "k")}
    assert routes.picks is picks
    registry.declare_queue("late")
    registry.bind("spread", "late")
    # 40,000 picks of 1,001: the chance that "late" is never picked is e**-40.
    picked |= {q.name for _ in range(40_000) for q in registry.route("spread", "k")}
    assert routes.picks is not picks
    assert "late" in picked
    assert picked <= {*names, "late"}


@pytest.mark.parametrize(
    ("destination", "binding_key", "refused"),
    [
        ("plain", "key", "binding key 'key' not permitted"),
        ("events", "", "not a stream queue"),
        ("other", "", "not exchanges"),
    ],
)
def test_x_local_random_binds_only_classic_queues_without_a_key(
    destination: str, binding_key: str, refused: str
) -> None:
    registry = QueueRegistry()
    registry.declare_exchange("spread", "x-local-random")
    registry.declare_exchange("other", "fanout")
    registry.declare_queue("plain")
    registry.declare_queue("events", {"x-queue-type": "stream"})
    with pytest.raises(PreconditionFailed, match=refused):
        registry.bind(
            "spread", destination, binding_key, to_exchange=registry.get(destination) is None
        )
