"""Stream filter values: a reader gets exactly the messages tagged with a value it wants, skips
chunks that hold none without reading them, and a read does bounded work however little of the
stream matches."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.filters.budget import DECODED_BYTES_PER_UNIT, EVALUATION_COST, READ_BUDGET
from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.stream_filter import (
    CHUNK_MESSAGES,
    NO_VALUE,
    UNKNOWN,
    ChunkFilters,
    StreamFilter,
    digest,
)
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.log.segments import SegmentWriter
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, MessageFilter, OffsetSpec
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.encoding import encode

_FIRST = OffsetSpec("first")


def _message(value: str | None, region: str = "eu") -> Message:
    # Untagged messages carry another annotation of the same size: every message has one size.
    key = "x-stream-filter-value" if value is not None else "x-opt-not-a-filter-v"
    annotations: dict[Value, Value] = {Symbol(key): value or "-"}
    payload = b"\x00\x53\x72" + encode(annotations)
    payload += b"\x00\x53\x74" + encode({"region": region})
    return Message(payload + encode(Described(0x77, "body")))


def _stream(arguments: dict[str, object] | None = None) -> StreamQueue:
    declared = {"x-queue-type": "stream", **(arguments or {})}
    return StreamQueue("s", parse_arguments(declared), clock=Clock())


def _attach(
    queue: StreamQueue,
    key: str,
    values: list[str] | None,
    unfiltered: bool = False,
    accept: MessageFilter | None = None,
    views: ViewCache | None = None,
) -> None:
    views = views or ViewCache()
    wanted = None if values is None else StreamFilter(values, unfiltered, views)
    options = ConsumerOptions(filter=accept, offset=_FIRST, stream_filter=wanted, views=views)
    queue.attach(key, ack_required=False, options=options)


def _read(queue: StreamQueue, key: str, credit: int = 10_000) -> list[int]:
    messages, _ = queue.credit(key, 0, credit, False)
    return [m.seq for m in messages]


def test_a_reader_gets_exactly_the_values_it_wants() -> None:
    queue = _stream()
    tags = ["apple", None, "banana", "cherry", "banana", None, "apple"] * 30
    for tag in tags:
        queue.enqueue(_message(tag))
    _attach(queue, "bananas", ["banana"])
    _attach(queue, "fruit", ["apple", "cherry"])
    _attach(queue, "bananas+untagged", ["banana"], unfiltered=True)
    assert _read(queue, "bananas") == [i for i, t in enumerate(tags) if t == "banana"]
    assert _read(queue, "fruit") == [i for i, t in enumerate(tags) if t in ("apple", "cherry")]
    wanted = [i for i, t in enumerate(tags) if t in ("banana", None)]
    assert _read(queue, "bananas+untagged") == wanted


def test_tail_readers_are_filtered_as_messages_arrive() -> None:
    queue = _stream()
    _attach(
        queue,
        "eu-bananas",
        ["banana"],
        accept=PropertiesFilter(ViewCache(), None, {"region": "eu"}),
    )
    queue.credit("eu-bananas", 0, 100, False)
    dispatched = []
    for tag, region in [("apple", "eu"), ("banana", "us"), ("banana", "eu"), (None, "eu")]:
        dispatched += queue.enqueue(_message(tag, region))
    assert [(key, m.seq) for key, m in dispatched] == [("eu-bananas", 2)]


def test_chunks_without_a_wanted_value_are_skipped_unread() -> None:
    queue = _stream()
    chunks = 50
    for i in range(chunks * CHUNK_MESSAGES):
        queue.enqueue(_message("banana" if i == chunks * CHUNK_MESSAGES - 1 else "apple"))
    views = ViewCache()
    counted = PropertiesFilter(views, None, {"region": "eu"})
    _attach(queue, "bananas", ["banana"], accept=counted, views=views)
    assert _read(queue, "bananas") == [chunks * CHUNK_MESSAGES - 1]
    # Only the one candidate was read by the message filter; the other 49 chunks were skipped
    # by their Bloom filter alone (a false positive would read a few more).
    assert views.statistics().decodes < CHUNK_MESSAGES


def test_a_read_that_finds_nothing_pauses_and_goes_on_at_the_next_tick() -> None:
    queue = _stream()
    total = 3 * READ_BUDGET
    for i in range(total):
        queue.enqueue(_message(None, "us" if i < total - 1 else "eu"))
    views = ViewCache()
    _attach(queue, "eu", None, accept=PropertiesFilter(views, None, {"region": "eu"}), views=views)
    first, reply = queue.credit("eu", 0, 10, False)
    assert first == []
    assert reply.credit == 10
    # One read reads a bounded number of messages, then waits for the clock: each message's
    # evaluation and the bytes it decoded are charged to the read's budget.
    # (each decodes 15 bytes of application-properties, one unit).
    stats = views.statistics()
    per_message = EVALUATION_COST + stats.decoded_bytes // stats.decodes // DECODED_BYTES_PER_UNIT
    assert per_message == EVALUATION_COST + 1
    assert stats.decodes <= READ_BUDGET // per_message + 1
    assert queue.next_deadline() == queue.clock.now
    ticks = 0
    dispatched: list[int] = []
    while not dispatched:
        ticks += 1
        assert ticks < 100
        dispatched = [m.seq for _, m in queue.expire()]
    assert dispatched == [total - 1]
    assert queue.next_deadline() is None


def test_recovered_messages_are_read_for_their_value(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    registry = QueueRegistry(Clock(), store=store)
    queue = registry.declare_queue("s", {"x-queue-type": "stream"})
    for tag in ["apple", None, "banana"]:
        stamped = queue.as_stored(_message(tag))
        queue.enqueue(store.enqueue("s", stamped.payload, 0))
    write_now(store, writer)
    store.close()
    writer.close()
    again = MessageStore(tmp_path)
    queue = QueueRegistry(Clock(), store=again).declare_queue("s", {"x-queue-type": "stream"})
    assert isinstance(queue, StreamQueue)
    queue.restore(again)
    stamped = queue.as_stored(_message("banana"))
    queue.enqueue(again.enqueue("s", stamped.payload, 0))
    _attach(queue, "bananas", ["banana"])
    assert _read(queue, "bananas") == [2, 3]
    again.close()


def test_chunk_filters_cost_nothing_until_a_message_is_tagged() -> None:
    chunks = ChunkFilters()
    for _ in range(100):
        chunks.append(NO_VALUE)
    untagged = chunks.active
    chunks.append(digest("x"))
    assert (untagged, chunks.active) == (False, True)
    assert [chunks.digest_at(o) for o in (0, 99, 100)] == [NO_VALUE, NO_VALUE, digest("x")]
    chunks.append(UNKNOWN)
    chunks.trim(100)
    assert chunks.digest_at(101) == UNKNOWN


@given(
    tags=st.lists(st.sampled_from(["a", "b", "c", None]), max_size=300),
    wanted=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=2),
    unfiltered=st.booleans(),
    grants=st.lists(st.integers(min_value=1, max_value=70), min_size=1, max_size=10),
    dropped=st.integers(min_value=0, max_value=300),
)
def test_filtered_reads_match_a_model(
    tags: list[str | None], wanted: list[str], unfiltered: bool, grants: list[int], dropped: int
) -> None:
    # Retention by size keeps the newest messages (at least one): the rest are dropped.
    kept = max(1, len(tags) - dropped)
    sizing = _stream()
    sizing.enqueue(_message("a"))
    queue = _stream({"x-max-length-bytes": kept * sizing.statistics().ready_bytes})
    for tag in tags:
        queue.enqueue(_message(tag))
    first = max(0, len(tags) - kept)
    _attach(queue, "r", wanted, unfiltered)
    expected = [
        i for i, t in enumerate(tags) if i >= first and (t in wanted or (t is None and unfiltered))
    ]
    got: list[int] = []
    delivery_count = 0
    for credit in grants:
        messages, reply = queue.credit("r", delivery_count, credit, False)
        got += [m.seq for m in messages]
        delivery_count = reply.delivery_count
    assert got == expected[: len(got)]
    assert len(got) == min(len(expected), sum(grants))
