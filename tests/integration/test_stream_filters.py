"""Filters on stream queues, with the filter sets RabbitMQ 4.2's clients send (issue 20 §4):
stream filter values, property filters and SQL filters, across a restart, and a long filtered
read that does not stall other clients."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Final, cast

import pytest
from integration.conftest import RunningServer, start_server
from proton import Described, Message, Timeout, symbol
from proton._data import PythonAMQPData
from proton.reactor import Filter
from proton.utils import BlockingConnection
from support.clients import publish
from support.prober import Prober

# A served prober's round, with room for a loaded shared machine.
PROBE_BOUND: Final = 5.0
_FIRST: Final = {
    symbol("rabbitmq:stream-offset-spec"): Described(symbol("rabbitmq:stream-offset-spec"), "first")
}


def _declare(running: RunningServer, name: str) -> None:
    running.call(lambda: running.server.registry.declare_queue(name, {"x-queue-type": "stream"}))


def _tagged(body: str, value: str | None, **fields: object) -> Message:
    annotations = {symbol("x-stream-filter-value"): value} if value is not None else None
    return Message(body=body, annotations=annotations, **fields)


def _filters(entries: Mapping[str, tuple[str, object]]) -> Filter:
    """A filter set as RabbitMQ's clients build it: key -> described(descriptor, value)."""
    described = {
        symbol(key): Described(symbol(descriptor), cast(PythonAMQPData, value))
        for key, (descriptor, value) in entries.items()
    }
    return Filter({**_FIRST, **described})


def _read(url: str, address: str, options: Filter, expect: int) -> tuple[list[str], int]:
    """The bodies a reader with ``options`` receives (``expect`` of them, then nothing more), and
    how many filters the server echoed."""
    connection = BlockingConnection(url)
    try:
        receiver = connection.create_receiver(address, credit=1000, options=options)
        echoed = receiver.link.remote_source.filter
        echoed.rewind()
        echoed.next()
        served = echoed.get_object()
        bodies = []
        for _ in range(expect):
            bodies.append(str(receiver.receive(timeout=20).body))
            receiver.accept()
        with contextlib.suppress(Timeout):
            extra = receiver.receive(timeout=1)
            raise AssertionError(f"an unexpected message {extra.body!r}")
        return bodies, len(served) if isinstance(served, dict) else 0
    finally:
        connection.close()


_VALUES = ["apple", None, "banana", "banana", None, "cherry", "apple", "banana"]


def test_stream_filter_values(server: RunningServer) -> None:
    _declare(server, "fruit")
    publish(
        server.url, "/queues/fruit", messages=[_tagged(f"m{i}", v) for i, v in enumerate(_VALUES)]
    )
    bananas = _filters({"rabbitmq:stream-filter": ("rabbitmq:stream-filter", ["banana"])})
    assert _read(server.url, "/queues/fruit", bananas, 3) == (["m2", "m3", "m7"], 2)
    untagged = _filters(
        {
            "rabbitmq:stream-filter": ("rabbitmq:stream-filter", "apple"),
            "rabbitmq:stream-match-unfiltered": ("rabbitmq:stream-match-unfiltered", True),
        }
    )
    assert _read(server.url, "/queues/fruit", untagged, 4) == (["m0", "m1", "m4", "m6"], 3)


def test_property_application_property_and_sql_filters_apply_on_a_stream(
    server: RunningServer,
) -> None:
    _declare(server, "orders")
    messages = [
        Message(
            body=f"m{i}",
            subject="order.created" if i % 2 else "order.deleted",
            reply_to="r",
            properties={"region": "eu" if i % 3 else "us", "amount": i * 10},
        )
        for i in range(12)
    ]
    publish(server.url, "/queues/orders", messages=messages)
    subject = _filters(
        {"properties": ("amqp:properties-filter", {symbol("subject"): "&s:.created"})}
    )
    assert _read(server.url, "/queues/orders", subject, 6)[0] == [f"m{i}" for i in range(1, 12, 2)]
    region = _filters({"app": ("amqp:application-properties-filter", {"region": "us"})})
    assert _read(server.url, "/queues/orders", region, 4)[0] == ["m0", "m3", "m6", "m9"]
    sql = _filters(
        {
            "sql-filter": (
                "amqp:sql-filter",
                "p.subject LIKE '%created' AND p.reply_to = 'r' AND amount >= 50 AND region = 'eu'",
            )
        }
    )
    assert _read(server.url, "/queues/orders", sql, 3) == (["m5", "m7", "m11"], 2)


def test_stream_filters_after_a_restart(tmp_path: Path) -> None:
    """Recovered messages have no digest: their values are read from the messages."""
    running = start_server(data_dir=tmp_path)
    try:
        _declare(running, "durable-fruit")
        publish(
            running.url,
            "/queues/durable-fruit",
            messages=[_tagged(f"m{i}", v) for i, v in enumerate(_VALUES)],
        )
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        publish(
            running.url,
            "/queues/durable-fruit",
            messages=[_tagged("m8", "banana"), _tagged("m9", "apple")],
        )
        bananas = _filters({"rabbitmq:stream-filter": ("rabbitmq:stream-filter", ["banana"])})
        assert _read(running.url, "/queues/durable-fruit", bananas, 4)[0] == [
            "m2",
            "m3",
            "m7",
            "m8",
        ]
    finally:
        running.stop()


@pytest.mark.alone  # bounds a latency: docs/testing.md
@pytest.mark.slow
def test_a_filtered_read_of_a_long_stream_does_not_stall_others(server: RunningServer) -> None:
    """An SQL filter that matches only the last of 20,000 messages: each read is bounded, the
    rest goes on at the next ticks while other clients are served."""
    _declare(server, "long")
    total = 20_000
    publish(
        server.url,
        "/queues/long",
        messages=[
            Message(body=f"m{i}", properties={"n": i, "pad": "x" * 200}) for i in range(total)
        ],
    )
    sql = _filters({"sql-filter": ("amqp:sql-filter", f"n = {total - 1} AND pad LIKE '%x_x%'")})
    with Prober(server.url) as prober:
        assert _read(server.url, "/queues/long", sql, 1)[0] == [f"m{total - 1}"]
        prober.wait_rounds(2, timeout=60)
    assert prober.seen.failures == []
    assert prober.seen.worst < PROBE_BOUND, prober.seen.rounds


def test_filter_entries_without_descriptors_are_read_by_their_key(server: RunningServer) -> None:
    """rhea (under RabbitMQ's JS client) sends the rabbitmq:stream-* entries as plain values;
    RabbitMQ takes each key for its descriptor. Read otherwise, the reader starts at ``next``
    and gets nothing of what is already in the stream."""
    _declare(server, "plain-filters")
    publish(
        server.url,
        "/queues/plain-filters",
        messages=[_tagged(f"m{i}", v) for i, v in enumerate(_VALUES)],
    )
    entries: dict[symbol, object] = {
        symbol("rabbitmq:stream-offset-spec"): "first",
        symbol("rabbitmq:stream-filter"): ["apple"],
        symbol("rabbitmq:stream-match-unfiltered"): True,
    }
    plain = Filter(cast(dict[symbol, Described], entries))
    assert _read(server.url, "/queues/plain-filters", plain, 4) == (["m0", "m1", "m4", "m6"], 3)
    # Other keys without a descriptor are still no filter: not echoed, not applied.
    other = Filter(cast(dict[symbol, Described], {**_FIRST, symbol("my-filter"): "apple"}))
    assert _read(server.url, "/queues/plain-filters", other, len(_VALUES))[1] == 1


@pytest.mark.parametrize("queue_type", ["stream", "classic"])
def test_an_empty_filter_value_is_unfiltered(server: RunningServer, queue_type: str) -> None:
    """RabbitMQ files a message tagged ``""`` with the unfiltered ones: a match-unfiltered
    reader gets it, a reader of values only does not."""
    name = f"empty-value-{queue_type}"
    server.call(lambda: server.server.registry.declare_queue(name, {"x-queue-type": queue_type}))
    messages = [_tagged("empty", ""), _tagged("none", None), _tagged("x", "x")]
    address = f"/queues/{name}"
    with_unfiltered = _filters(
        {
            "rabbitmq:stream-filter": ("rabbitmq:stream-filter", ["x"]),
            "rabbitmq:stream-match-unfiltered": ("rabbitmq:stream-match-unfiltered", True),
        }
    )
    only_x = _filters({"rabbitmq:stream-filter": ("rabbitmq:stream-filter", ["x"])})
    if queue_type == "stream":
        publish(server.url, address, messages=messages)
        assert _read(server.url, address, with_unfiltered, 3)[0] == ["empty", "none", "x"]
        assert _read(server.url, address, only_x, 1)[0] == ["x"]
        return
    # A classic queue's consumer takes what it reads: one reader per publication.
    publish(server.url, address, messages=messages)
    assert _read(server.url, address, only_x, 1)[0] == ["x"]
    assert _read(server.url, address, with_unfiltered, 2)[0] == ["empty", "none"]
