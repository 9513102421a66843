"""The channel's frames survive the byte stream in pieces of any size, and a broken stream ends
the channel with ChannelError before it makes the reader hold or build more than one frame."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.session.channel.codec import (
    FRAME_OVERHEAD,
    HEAD_SIZE,
    ChannelError,
    FrameReader,
    encode,
)
from sluicegate.session.channel.frames import (
    ANSWER_COUNTS,
    Answer,
    Attach,
    Attached,
    Confirm,
    Credit,
    CreditReply,
    Deliveries,
    Detach,
    Error,
    Frame,
    GiveBack,
    Kind,
    Letters,
    Publish,
    Query,
    QueryOp,
    Settle,
    Settled,
    Topology,
    ranges_of,
)
from sluicegate.wire.encoding import encode as amqp
from sluicegate.wire.sections import DEFAULT_HEADER, Header

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
NAMES = st.text(max_size=40)
PAYLOADS = st.binary(max_size=300)
MAX_FRAME = 64 * 1024


@st.composite
def deliveries(draw: st.DrawFn) -> Deliveries:
    payloads = draw(st.lists(PAYLOADS, max_size=8))
    seqs = draw(st.lists(U64, min_size=len(payloads), max_size=len(payloads)))
    return Deliveries(draw(U32), tuple(seqs), tuple(payloads))


@st.composite
def settles(draw: st.DrawFn) -> Settle:
    return Settle(
        draw(U32),
        draw(st.sampled_from(Settled)),
        ranges_of(draw(st.lists(st.integers(0, 10_000), max_size=20))),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.none() | st.binary(max_size=50)),
    )


HEADERS = st.builds(
    Header,
    st.booleans(),
    st.integers(0, 255),
    st.none() | U32,
    st.booleans(),
    U32,
)
STAMPS = st.tuples(st.none() | st.integers(-(2**63), 2**63 - 1), HEADERS, U32)


@st.composite
def publishes(draw: st.DrawFn) -> Publish:
    stamps = draw(st.lists(STAMPS, max_size=6))
    payloads = draw(st.lists(PAYLOADS, min_size=len(stamps), max_size=len(stamps)))
    vhost, queue, exchange, routing_key = (draw(NAMES) for _ in range(4))
    letters = draw(st.booleans())
    publisher = draw(U64)
    return Publish(
        draw(U64), vhost, queue, exchange, routing_key, payloads, stamps, letters, publisher
    )


@st.composite
def confirms(draw: st.DrawFn) -> Confirm:
    first = draw(U64)
    last = draw(st.integers(first, 2**64 - 1))
    return Confirm(first, last, draw(st.sampled_from(Settled)), draw(NAMES), draw(NAMES))


# A topology change as it crosses: one AMQP list led by its verb.
CHANGES = st.lists(NAMES, max_size=4).map(lambda rest: amqp(["queue", *rest]))


@st.composite
def queries(draw: st.DrawFn) -> Query:
    op = draw(st.sampled_from(QueryOp))
    declaration = draw(CHANGES) if op in (QueryOp.DECLARE, QueryOp.DECLARE_EXCHANGE) else b""
    return Query(draw(U32), op, draw(NAMES), draw(NAMES), declaration)


FRAMES: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Attach,
        U32,
        NAMES,
        NAMES,
        st.booleans(),
        st.booleans(),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=50),
    ),
    st.builds(Attached, U32),
    st.builds(Detach, U32, U32, st.lists(U64, max_size=10).map(tuple)),
    st.builds(GiveBack, U32, st.lists(U64, max_size=10).map(tuple)),
    st.builds(Credit, U32, U32, U32, st.booleans(), st.booleans()),
    st.builds(CreditReply, U32, U32, U32, U64, st.booleans(), st.booleans()),
    deliveries(),
    settles(),
    publishes(),
    confirms(),
    st.builds(Error, U32, NAMES, NAMES),
    st.builds(Topology, NAMES, CHANGES),
    queries(),
    st.builds(Letters, U32, U64),
    st.builds(
        Answer,
        U32,
        st.booleans(),
        U64,
        st.lists(
            st.integers(-(2**63), 2**63 - 1), min_size=ANSWER_COUNTS, max_size=ANSWER_COUNTS
        ).map(tuple),
    ),
)


@given(st.lists(FRAMES, max_size=10), st.lists(st.integers(1, 97), min_size=1))
def test_frames_come_back_as_sent_whatever_the_pieces(frames: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(piece for frame in frames for piece in encode(frame))
    reader = FrameReader(MAX_FRAME)
    got: list[Frame] = []
    at = 0
    for cut in itertools.cycle(cuts):
        if at >= len(stream):
            break
        got.extend(reader.feed(stream[at : at + cut]))
        at += cut
    assert got == frames
    assert reader.buffered == 0


@given(st.lists(FRAMES, max_size=10), st.lists(st.integers(1, 97), min_size=1))
def test_frames_read_into_the_buffer_come_back_as_sent(
    frames: list[Frame], sizes: list[int]
) -> None:
    stream = memoryview(b"".join(piece for frame in frames for piece in encode(frame)))
    reader = FrameReader(MAX_FRAME)
    got: list[Frame] = []
    at = 0

    def read(into: memoryview) -> int:
        count = min(len(into), len(stream) - at)
        into[:count] = stream[at : at + count]
        return count

    for size in itertools.cycle(sizes):
        count, completed = reader.fill(read, size)
        got.extend(completed)
        at += count
        if count == 0:
            break
    assert got == frames
    assert reader.buffered == 0


def test_a_failed_read_leaves_the_buffer_as_it_was() -> None:
    reader = FrameReader(MAX_FRAME)
    reader.feed(b"\x05\x00")

    def fail(into: memoryview) -> int:
        raise BlockingIOError

    with pytest.raises(BlockingIOError):
        reader.fill(fail, 4096)
    assert reader.buffered == 2
    # The frame's rest completes it as if nothing had happened.
    assert reader.feed(b"\x00\x00" + bytes([Kind.ATTACHED]) + b"\x07\x00\x00\x00") == [Attached(7)]


def test_a_reader_keeps_the_room_of_a_read_and_lets_a_large_frame_go() -> None:
    reader = FrameReader(1 << 21)
    small = b"".join(encode(Credit(1, 0, 256, False, False)))
    large = b"".join(encode(_publish([b"p" * 600_000])))
    stream = memoryview(small * 100 + large + small)
    at = 0

    def read(into: memoryview) -> int:
        count = min(len(into), len(stream) - at, 100)
        into[:count] = stream[at : at + count]
        return count

    sizes: list[int] = []
    while at < len(stream):
        count, _ = reader.fill(read, 4096)
        at += count
        sizes.append(len(reader.buffer))
    # Reads of 4 KiB: the buffer is a read's room until the large frame, then gives it back.
    assert max(sizes[:10]) <= 4096 + len(small)
    assert max(sizes) < len(large) + 4096 * 2
    assert reader.buffered == 0
    assert len(reader.buffer) <= 4096


def test_a_payload_is_handed_to_the_socket_as_the_queue_holds_it() -> None:
    payloads = (b"x" * 1000, b"y" * 10)
    pieces = encode(Deliveries(7, (1, 2), payloads))
    assert any(piece is payloads[0] for piece in pieces)
    assert any(piece is payloads[1] for piece in pieces)


def test_ranges_merge_runs_and_keep_gaps() -> None:
    assert ranges_of([5, 1, 2, 3, 3, 9, 10]) == ((1, 3), (5, 5), (9, 10))
    assert ranges_of([]) == ()
    assert ranges_of([4, 5, 6]) == ((4, 6),)
    assert ranges_of([4, 4, 6]) == ((4, 4), (6, 6))


@given(st.lists(st.integers(0, 60), max_size=30))
def test_ranges_name_each_sequence_number_once_sorted_and_merged(seqs: list[int]) -> None:
    ranges = ranges_of(seqs)
    assert [seq for first, last in ranges for seq in range(first, last + 1)] == sorted(set(seqs))
    # Merged: no two ranges touch.
    assert all(before[1] + 1 < after[0] for before, after in itertools.pairwise(ranges))


def test_a_frame_announced_over_the_limit_ends_the_channel_before_its_bytes_are_kept() -> None:
    reader = FrameReader(1024 + FRAME_OVERHEAD)
    head = struct.pack("<IB", 10_000_000, Kind.PUBLISH)
    with pytest.raises(ChannelError, match="over the channel's"):
        reader.feed(head)


def _publish(payloads: list[bytes]) -> Publish:
    return Publish(1, "/", "q", "", "k", payloads, [(None, DEFAULT_HEADER, 0)] * len(payloads))


def test_a_half_frame_waits_and_holds_only_its_bytes() -> None:
    stream = b"".join(encode(_publish([b"p" * 500])))
    reader = FrameReader(MAX_FRAME)
    assert reader.feed(stream[:100]) == []
    assert reader.buffered == 100
    assert reader.feed(stream[100:]) == [_publish([b"p" * 500])]
    assert reader.buffered == 0


def test_a_run_of_publishes_reads_its_names_once_and_each_stamp_back() -> None:
    header = Header(durable=True, priority=9, ttl=60_000, first_acquirer=True, delivery_count=2)
    frame = Publish(7, "/", "q", "x", "k", [b"a", b"", b"ccc"], [
        (None, DEFAULT_HEADER, 0), (1_700_000_000_000, header, 3), (0, header, 0)
    ])  # fmt: skip
    (back,) = FrameReader(MAX_FRAME).feed(b"".join(encode(frame)))
    assert back == frame
    # One pieces list: the head, four names (size and bytes), the table, then the payloads.
    assert encode(frame)[-3:] == [b"a", b"", b"ccc"]


def test_a_publish_counting_more_stamps_than_it_holds_ends_the_channel() -> None:
    body = struct.pack("<QIBQ", 1, 1_000_000, 0, 0) + b"\x00\x00" * 4
    with pytest.raises(ChannelError, match="counts more"):
        FrameReader(MAX_FRAME).feed(_raw(Kind.PUBLISH, body))


def _raw(kind: int, body: bytes) -> bytes:
    return struct.pack("<IB", len(body) + 1, kind) + body


def _topology(change: bytes) -> bytes:
    """A TOPOLOGY frame for vhost "/" carrying ``change`` as it is."""
    vhost = struct.pack("<H", 1) + b"/"
    return _raw(Kind.TOPOLOGY, vhost + struct.pack("<I", len(change)) + change)


def _query(op: int, declaration: bytes) -> bytes:
    names = struct.pack("<H", 1) + b"/" + struct.pack("<H", 1) + b"q"
    blob = struct.pack("<I", len(declaration)) + declaration
    return _raw(Kind.QUERY, struct.pack("<IB", 1, op) + names + blob)


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (_raw(99, b""), "unknown frame kind 99"),
        (_raw(Kind.CREDIT, b"\x01\x00"), "ends inside its fields"),
        (_raw(Kind.CREDIT, struct.pack("<IIIBQ", 1, 2, 3, 0, 4) + b"!"), "bytes after its fields"),
        # A count of 2**32-1 deliveries in a 20-byte body: refused before any table is built.
        (_raw(Kind.DELIVERIES, struct.pack("<II", 1, 2**32 - 1) + b"\0" * 12), "counts more"),
        # A payload size past the frame's end.
        (
            _raw(Kind.DELIVERIES, struct.pack("<IIQI", 1, 1, 0, 1000) + b"x"),
            "ends inside its fields",
        ),
        (_raw(Kind.DETACH, struct.pack("<III", 1, 0, 2**32 - 1)), "counts more"),
        (_raw(Kind.SETTLE, struct.pack("<IBBI", 1, 0, 0, 1) + struct.pack("<QQ", 9, 3)), "ends"),
        (_raw(Kind.SETTLE, struct.pack("<IBBI", 1, 7, 0, 0)), "unknown outcome 7"),
        (_raw(Kind.CONFIRM, struct.pack("<QQB", 5, 4, 0) + b"\0" * 4), "ends before"),
        (_raw(Kind.ERROR, struct.pack("<IH", 1, 2) + b"\xff\xfe" + b"\0\0"), "not UTF-8"),
        (struct.pack("<IB", 0, 1), "over the channel's"),
        (_raw(Kind.QUERY, struct.pack("<IB", 1, 9) + b"\0" * 4), "unknown query 9"),
        # Topology changes that are not one whole AMQP list led by its verb (issue 35): ended
        # here, never a DecodeError in whatever applies them.
        (_topology(b"\xff\x01"), "does not decode"),
        (_topology(b""), "does not decode"),
        (_topology(b"\xc0\x05\x02\xa1\x01q"), "does not decode"),
        (_topology(amqp(["queue"]) + b"\x40"), "not one whole list"),
        (_topology(amqp("queue")), "not one whole list"),
        (_topology(amqp([])), "not one whole list"),
        (_topology(amqp([7, "q"])), "does not start with its verb"),
        (_query(QueryOp.DECLARE, b"\xa1\x09queue"), "does not decode"),
        (_query(QueryOp.DECLARE_EXCHANGE, b"\xa1\x09exchange"), "does not decode"),
        (_query(QueryOp.COUNTS, amqp(["queue", "q"])), "COUNTS query carries a declaration"),
        # An answer one count short: its fixed size is read whole or not at all.
        (_raw(Kind.ANSWER, struct.pack(f"<IBQ{ANSWER_COUNTS - 1}q", 1, 1, 0, *[0] * 18)), "ends"),
    ],
)
def test_a_broken_frame_ends_the_channel_with_a_reason(stream: bytes, reason: str) -> None:
    assert len(stream) >= HEAD_SIZE
    with pytest.raises(ChannelError, match=reason):
        FrameReader(MAX_FRAME).feed(stream)


@pytest.mark.parametrize("sizes", [[100] * 600, [index % 7 * 40 for index in range(600)]])
def test_a_run_longer_than_one_unpack_comes_back_in_order(sizes: list[int]) -> None:
    payloads = [bytes([index % 251]) * size for index, size in enumerate(sizes)]
    seqs = tuple(range(1_000, 1_000 + len(sizes)))
    sent = Deliveries(3, seqs, tuple(payloads))
    published = Publish(1, "/", "q", "", "q", payloads, [(None, DEFAULT_HEADER, 0)] * len(sizes))
    stream = b"".join([*encode(sent), *encode(published)])
    assert FrameReader(len(stream)).feed(stream) == [sent, published]
