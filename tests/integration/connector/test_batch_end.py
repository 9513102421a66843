"""Where ``maxBytesPerTrigger`` batches of a stream end, as the gateway answers, against a real one.

No Spark here: :func:`spark.queue_info.batch_end` is called as the streaming runner calls it,
batch after batch, and its ends are compared with a greedy split of the sizes read over AMQP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from support.clients import publish

from sluicegate.queues import stream
from sluicegate.spark.amqp import AmqpConnection
from sluicegate.spark.options import ReadOptions, parse_read_options
from sluicegate.spark.queue_info import batch_end
from sluicegate.spark.stream_source import OFFSET_SPEC, next_offset
from sluicegate.wire.annotations import read_stream_offset


def _options(running: RunningServer) -> ReadOptions:
    raw = {
        "url": running.url,
        "address": "/queues/events",
        "mode": "stream",
        "maxBytesPerTrigger": "1",
    }
    return parse_read_options(raw, streaming=True)


def _stream(
    make_server: Callable[..., RunningServer], tmp_path: Path, arguments: dict[str, object]
) -> RunningServer:
    running = make_server(data_dir=tmp_path / "data")
    running.call(
        lambda: running.server.registry.declare_queue(
            "events", {"x-queue-type": "stream", **arguments}
        )
    )
    return running


def _delivered(amqp: AmqpConnection) -> list[tuple[int, int]]:
    """``(offset, encoded size)`` of every message the stream holds, read from ``first``."""
    link = amqp.receiver(
        "/queues/events", settled=True, filters={OFFSET_SPEC: (OFFSET_SPEC, "first")}, timeout=30
    )
    link.drain(1_000_000)
    found: list[tuple[int, int]] = []
    while True:
        delivery = link.current
        while delivery is not None and delivery.readable and not delivery.partial:
            payload = link.recv(delivery.pending) or b""
            link.advance()
            delivery.settle()
            found.append((_offset_of(payload), len(payload)))
            delivery = link.current
        if not link.draining() and link.queued == 0:
            link.close()
            return found
        amqp.wait(lambda: link.current is not None or not link.draining(), 30, "the stream")


def _offset_of(payload: bytes) -> int:
    offset = read_stream_offset(payload)
    assert offset is not None
    return offset


def _greedy_ends(messages: list[tuple[int, int]], start: int, max_bytes: int) -> list[int]:
    """The end offsets of successive batches from ``start`` over the messages that exist."""
    ends: list[int] = []
    pending = [(offset, size) for offset, size in messages if offset >= start]
    while pending:
        taken, total = 0, 0
        while taken < len(pending) and (taken == 0 or total + pending[taken][1] <= max_bytes):
            total += pending[taken][1]
            taken += 1
        ends.append(pending[taken][0] if taken < len(pending) else pending[-1][0] + 1)
        pending = pending[taken:]
    return ends


def _ends(amqp: AmqpConnection, options: ReadOptions, start: int, max_bytes: int) -> list[int]:
    tail = next_offset(amqp, options)
    ends: list[int] = []
    while start < tail:
        start = batch_end(amqp, options, start, tail, max_bytes)
        ends.append(start)
    return ends


@contextmanager
def _published(
    make_server: Callable[..., RunningServer],
    tmp_path: Path,
    arguments: dict[str, object],
    bodies: list[bytes],
) -> Iterator[tuple[AmqpConnection, ReadOptions, list[tuple[int, int]]]]:
    """A stream holding ``bodies``, a connection to it, and what it delivers from its first."""
    running = _stream(make_server, tmp_path, arguments)
    outcomes = publish(running.url, "/queues/events", bodies).outcomes
    assert outcomes == ["accepted"] * len(bodies)
    options = _options(running)
    amqp = AmqpConnection.open(options.endpoint)
    try:
        yield amqp, options, _delivered(amqp)
    finally:
        amqp.close()


def test_batches_follow_the_sizes_from_any_start(
    make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    bodies = [b"y" * (10 + (n * 97) % 900) for n in range(3_000)]
    with _published(make_server, tmp_path, {}, bodies) as (amqp, options, messages):
        assert _ends(amqp, options, 0, 50_000) == _greedy_ends(messages, 0, 50_000)
        # Spark restarting from a checkpoint asks from an offset planned before.
        assert _ends(amqp, options, 1_234, 20_000) == _greedy_ends(messages, 1_234, 20_000)
        # A message larger than the limit is a batch of its own.
        assert _ends(amqp, options, 2_990, 5) == list(range(2_991, 3_001))


def test_offsets_retention_dropped_hold_no_bytes(
    make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Retention dropped the head: the batches start at the oldest offset kept."""
    bodies = [b"z" * 300 for _ in range(1_000)]
    retention: dict[str, object] = {"x-max-length-bytes": 60_000}
    with _published(make_server, tmp_path, retention, bodies) as (amqp, options, messages):
        assert messages[0][0] > 0  # the head is gone
        assert _ends(amqp, options, 0, 5_000) == _greedy_ends(messages, 0, 5_000)


def test_a_range_longer_than_one_request_sums_is_asked_for_in_parts(
    make_server: Callable[..., RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway sums a bounded number of sizes per request; the connector asks on."""
    monkeypatch.setattr(stream, "MAX_SIZES_PER_RANGE", 7)  # the gateway runs in this process
    bodies = [b"q" * (50 + n % 13) for n in range(100)]
    with _published(make_server, tmp_path, {}, bodies) as (amqp, options, messages):
        assert _ends(amqp, options, 0, 2_000) == _greedy_ends(messages, 0, 2_000)
        assert _ends(amqp, options, 3, 10**9) == [100]
