"""The stream queue: offsets stamped into the bytes, readers from any offset, retention."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.filters.budget import EVALUATION_COST, READ_BUDGET
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, OffsetSpec, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import MAX_SIZES_PER_RANGE, StreamQueue, parse_max_age
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.annotations import read_stream_offset, stamp_stream_offset
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import sections

_BODY = encode(Described(0x77, "the body, never decoded"))


def _payload(i: int) -> bytes:
    return (
        b"\x00\x53\x70" + encode([True])
        + b"\x00\x53\x72" + encode({Symbol("x-exchange"): "", Symbol("x-routing-key"): "s"})
        + encode(Described(0x77, f"m{i}"))
    )  # fmt: skip


def _stream(clock: Clock | None = None, arguments: dict[str, object] | None = None) -> StreamQueue:
    declared = {"x-queue-type": "stream", **(arguments or {})}
    return StreamQueue("s", parse_arguments(declared), clock=clock or Clock())


def _reader(queue: StreamQueue, key: str, spec: OffsetSpec | None) -> None:
    queue.attach(key, ack_required=True, options=ConsumerOptions(offset=spec))


def _read(queue: StreamQueue, key: str, credit: int = 100) -> list[int]:
    messages, _ = queue.credit(key, 0, credit, False)
    return [m.seq for m in messages]


def test_the_offset_is_spliced_into_the_annotations_and_the_rest_kept() -> None:
    stamped = stamp_stream_offset(_payload(1), 41)[0]
    assert read_stream_offset(stamped) == 41
    found = {code: value for code, value, _, _ in sections(stamped)}
    assert found[0x72] == {
        Symbol("x-exchange"): "",
        Symbol("x-routing-key"): "s",
        Symbol("x-stream-offset"): 41,
    }
    assert stamped.endswith(encode(Described(0x77, "m1")))
    # A message without annotations gets a section after its header.
    bare = b"\x00\x53\x70" + encode([True]) + _BODY
    assert read_stream_offset(stamp_stream_offset(bare, 7)[0]) == 7
    assert stamp_stream_offset(bare, 7)[0].endswith(_BODY)


def test_every_reader_gets_everything_from_first() -> None:
    queue = _stream()
    for i in range(5):
        queue.enqueue(Message(_payload(i)))
    _reader(queue, "a", OffsetSpec("first"))
    _reader(queue, "b", OffsetSpec("first"))
    assert _read(queue, "a") == [0, 1, 2, 3, 4]
    assert _read(queue, "b") == [0, 1, 2, 3, 4]
    delivered, _ = queue.credit("a", 5, 10, False)
    assert delivered == []
    # A new message goes to every reader with credit at the tail.
    dispatched = queue.enqueue(Message(_payload(5)))
    assert sorted(str(key) for key, _ in dispatched) == ["a", "b"]
    assert all(read_stream_offset(m.payload) == 5 for _, m in dispatched)


def test_a_new_message_walks_only_the_readers_waiting_at_the_tail() -> None:
    """Each append walked every reader, with credit or not, behind or not: O(readers) per
    message for thousands of idle readers one client attached. Readers join the tail's
    waiters as a read leaves them there with credit, and leave it when spent, drained,
    moved back or gone; each still gets what it is owed."""
    queue = _stream()
    for i in range(1_000):
        _reader(queue, f"idle{i}", OffsetSpec("first"))
    _reader(queue, "a", OffsetSpec("next"))
    _reader(queue, "b", OffsetSpec("next"))
    _reader(queue, "drained", OffsetSpec("next"))
    assert _read(queue, "a", 3) == []
    assert _read(queue, "b", 10) == []
    queue.credit("drained", 0, 5, True)
    assert set(queue._tail) == {queue._consumers["a"], queue._consumers["b"]}
    sent = [queue.enqueue(Message(_payload(i))) for i in range(4)]
    assert [sorted(str(key) for key, _ in dispatched) for dispatched in sent] == [
        ["a", "b"], ["a", "b"], ["a", "b"], ["b"],
    ]  # fmt: skip
    # "a" spent its credit: out; "b" handed back what its session never sent: out, and reads
    # them again at its next request.
    b_messages = [m for dispatched in sent for key, m in dispatched if key == "b"]
    queue.give_back("b", b_messages[2:])
    assert queue._tail == {}
    again, _ = queue.credit("b", 2, 10, False)
    assert [m.seq for m in again] == [2, 3]
    assert set(queue._tail) == {queue._consumers["b"]}
    queue.detach("b", [])
    assert queue._tail == {}
    # An idle reader asked later reads everything from where it is.
    assert _read(queue, "idle7", 10) == [0, 1, 2, 3]


def test_the_filters_of_readers_at_the_tail_cost_the_appends_a_budget_per_tick() -> None:
    """Each append ran the filter of every filtered reader at the tail, uncharged: 1,000 of
    them made a publish 1,000 evaluations. Now they draw on one budget until the next tick;
    those past it read the message on at the tick, in their turn, and miss nothing."""
    queue = _stream()
    evaluations = 0

    def even(message: Message) -> bool:
        nonlocal evaluations
        evaluations += 1
        return (read_stream_offset(message.payload) or 0) % 2 == 0

    readers = [f"r{i}" for i in range(1_000)]
    for key in readers:
        queue.attach(key, ack_required=True, options=ConsumerOptions(filter=even))
        assert _read(queue, key, 10) == []
    got: dict[str, list[int]] = {key: [] for key in readers}
    for i in range(4):
        for consumer, message in queue.enqueue(Message(_payload(i))):
            got[str(consumer)].append(message.seq)
    # One budget's worth of evaluations for the four appends together.
    assert evaluations <= READ_BUDGET // (EVALUATION_COST + 1) + 1
    ticks = 0
    while queue.next_deadline() is not None:
        for consumer, message in queue.expire():
            got[str(consumer)].append(message.seq)
        ticks += 1
        assert ticks <= len(readers)
    assert got == {key: [0, 2] for key in readers}
    assert evaluations <= 4 * len(readers)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (OffsetSpec("first"), [0, 1, 2, 3]),
        (OffsetSpec("offset", 2), [2, 3]),
        (OffsetSpec("offset", 99), []),
        (OffsetSpec("last"), [3]),
        (OffsetSpec("next"), []),
        (None, []),
        (OffsetSpec("timestamp", 2500), [3]),
        (OffsetSpec("timestamp", 2000), [2, 3]),
        (OffsetSpec("timestamp", 0), [0, 1, 2, 3]),
    ],
)
def test_offset_specs_start_where_rabbitmq_does(
    spec: OffsetSpec | None, expected: list[int]
) -> None:
    clock = Clock()
    queue = _stream(clock)
    for i in range(4):
        clock.now = 1000 * i
        queue.enqueue(Message(_payload(i)))
    _reader(queue, "r", spec)
    assert _read(queue, "r") == expected


def test_credit_bounds_each_read_and_settlement_changes_nothing() -> None:
    queue = _stream()
    for i in range(10):
        queue.enqueue(Message(_payload(i)))
    _reader(queue, "r", OffsetSpec("first"))
    messages, reply = queue.credit("r", 0, 3, False)
    assert [m.seq for m in messages] == [0, 1, 2]
    assert reply.available == 7
    assert queue.settle("r", [0, 1, 2], Outcome.ACCEPTED, False) == []
    assert queue.settle("r", [0], Outcome.RELEASED, False) == []
    assert queue.statistics().ready == 10
    more, reply = queue.credit("r", 3, 4, True)
    assert [m.seq for m in more] == [3, 4, 5, 6]
    assert (reply.credit, reply.delivery_count) == (0, 7)


def test_retention_by_bytes_drops_the_oldest_and_moves_first() -> None:
    size = len(stamp_stream_offset(_payload(0), 0)[0])
    queue = _stream(arguments={"x-max-length-bytes": 3 * size})
    for i in range(10):
        queue.enqueue(Message(_payload(i)))
    stats = queue.statistics()
    assert (stats.first_offset, stats.last_offset, stats.ready) == (7, 9, 3)
    _reader(queue, "r", OffsetSpec("offset", 2))
    assert _read(queue, "r") == [7, 8, 9]


def test_retention_by_age_runs_on_the_clock() -> None:
    clock = Clock(0)
    queue = _stream(clock, {"x-max-age": "10s"})
    for i in range(5):
        clock.now = i * 4000
        queue.enqueue(Message(_payload(i)))
    # At 16 s the messages from 0 s and 4 s are 10 s old or more.
    assert queue.statistics().first_offset == 2
    assert queue.next_deadline() == 8000 + 10_000
    clock.now = 30_000
    registry = QueueRegistry(clock)
    aged = registry.declare_queue("aged", {"x-queue-type": "stream", "x-max-age": "10s"})
    aged.enqueue(Message(_payload(0)))
    assert set(registry.timed) == {aged}
    queue.expire()
    stats = queue.statistics()
    assert (stats.ready, stats.first_offset, stats.last_offset) == (0, None, None)
    assert stats.next_offset == 5  # emptied by retention, it still knows where it stands
    assert queue.next_deadline() is None
    queue.enqueue(Message(_payload(5)))
    assert queue.statistics().first_offset == 5


def test_a_reader_left_behind_by_retention_continues_at_first() -> None:
    size = len(stamp_stream_offset(_payload(0), 0)[0])
    queue = _stream(arguments={"x-max-length-bytes": 2 * size})
    for i in range(2):
        queue.enqueue(Message(_payload(i)))
    _reader(queue, "r", OffsetSpec("first"))
    assert _read(queue, "r", 1) == [0]
    for i in range(2, 6):
        queue.enqueue(Message(_payload(i)))
    assert _read(queue, "r", 10) == [4, 5]


def test_bad_ages_are_refused() -> None:
    for age in ("10", "0s", "5w", 7):
        with pytest.raises(PreconditionFailed, match="x-max-age"):
            parse_max_age(age)


def test_purge_drops_everything_and_offsets_go_on() -> None:
    queue = _stream()
    for i in range(3):
        queue.enqueue(Message(_payload(i)))
    assert queue.purge() == 3
    stats = queue.statistics()
    assert (stats.ready, stats.first_offset, stats.ready_bytes) == (0, None, 0)
    queue.enqueue(Message(_payload(3)))
    assert queue.statistics().first_offset == 3


def _byte_range_one_by_one(
    sizes: list[int], start: int, stop: int, max_bytes: int, at_least_one: bool
) -> tuple[int, int, bool]:
    """What a byte range means, message by message (queues/stream.py sums it in blocks)."""
    stop = min(stop, len(sizes))
    if start >= stop:
        return start, 0, False
    scanned = min(stop, start + MAX_SIZES_PER_RANGE)
    taken = 0
    for offset in range(start, scanned):
        if taken + sizes[offset] > max_bytes:
            if offset == start and at_least_one:
                return start + 1, sizes[offset], False
            return offset, taken, False
        taken += sizes[offset]
    return scanned, taken, scanned < stop


@settings(max_examples=examples(60), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=40),
    repeat=st.integers(1, 700),
    start=st.integers(0, 30_000),
    span=st.integers(0, 30_000),
    max_bytes=st.integers(0, 2_000_000),
    at_least_one=st.booleans(),
)
def test_a_byte_range_is_what_summing_message_by_message_gives(
    lengths: list[int], repeat: int, start: int, span: int, max_bytes: int, at_least_one: bool
) -> None:
    queue = _stream()
    payloads = [_payload(0) + b"\x00" * n for n in lengths]
    count = len(lengths) * repeat
    for i in range(count):
        queue.enqueue(Message(payloads[i % len(payloads)]))
    # The bytes each message takes on the wire, its offset annotation spliced in.
    sizes = list(queue.entries.sizes(0, count))
    assert sizes == [queue.entries[i].read_size() for i in range(count)]
    expected = _byte_range_one_by_one(sizes, start, start + span, max_bytes, at_least_one)
    assert queue.byte_range(start, start + span, max_bytes, at_least_one=at_least_one) == expected
