"""A consumer's filter set and stream offset across the channel: encoded within its bound,
read back as it was, refused as a broken peer when malformed, and compiled by the owner as a
local attach compiles it (same filters, same errors; docs/workers.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.filters.filter_set import LANGUAGES, FilterSet
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, ConsumerOptions, OffsetSpec, QueueType
from sluicegate.queues.stream import StreamQueue
from sluicegate.session.channel.codec import ChannelError, FrameReader, encode
from sluicegate.session.channel.filter_sets import decode_filter_set, encode_filter_set
from sluicegate.session.channel.frames import (
    Attach,
    Attached,
    Credit,
    CreditReply,
    Deliveries,
    Error,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.remote import Remote, RemoteQueue
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.annotations import read_stream_offset
from sluicegate.wire.encoding import encode as amqp

LIMIT = 1 << 20
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.text(max_size=8).map(Symbol),
)
_MAPS = st.none() | st.dictionaries(st.text(max_size=8), _SCALARS, max_size=4)


@st.composite
def _filter_sets(draw: st.DrawFn) -> FilterSet:
    kind = draw(st.sampled_from([None, "first", "last", "next", "offset", "timestamp"]))
    value = draw(st.integers(0, 1 << 40)) if kind in ("offset", "timestamp") else 0
    expressions = draw(
        st.lists(st.tuples(st.sampled_from(LANGUAGES), st.text(max_size=20)), max_size=3)
    )
    values = draw(st.none() | st.lists(st.text(max_size=8), max_size=3).map(tuple))
    return FilterSet(
        None if kind is None else OffsetSpec(kind, value),
        draw(_MAPS),
        draw(_MAPS),
        tuple(expressions),
        values,
        draw(st.booleans()),
    )


@settings(max_examples=examples(200), deadline=None)
@given(_filter_sets())
def test_a_filter_set_reads_back_as_it_was_sent(filters: FilterSet) -> None:
    data = encode_filter_set(filters, LIMIT)
    assert decode_filter_set(data) == (FilterSet() if filters.empty else filters)
    # And inside an ATTACH frame, through the channel's reader.
    frame = Attach(7, "/", "q", True, False, 0, data)
    assert FrameReader(LIMIT).feed(b"".join(encode(frame))) == [frame]


def test_a_set_over_the_bound_is_refused_before_it_crosses() -> None:
    many = FilterSet(expressions=(("sql", "a = 1"),) * 100)
    size = len(encode_filter_set(many, LIMIT))
    assert encode_filter_set(many, size)
    with pytest.raises(ResourceLimitExceeded, match=f"{size} bytes"):
        encode_filter_set(many, size - 1)
    # A RemoteQueue refuses it before any frame is queued.
    remote = Remote(1, max_filter_set_size=size - 1)
    remote.opened()
    with pytest.raises(ResourceLimitExceeded):
        RemoteQueue("q", "/", remote).attach(
            "consumer", ack_required=True, options=ConsumerOptions(filter_set=many)
        )
    assert remote.outgoing == []
    assert remote.consumers == {}


@pytest.mark.parametrize(
    "value",
    [
        b"\x00",
        amqp([1, 2]),
        amqp(["next", 0, None, None, [], None, True]) + b"\x40",
        amqp(["sideways", 0, None, None, [], None, False]),
        amqp(["offset", "7", None, None, [], None, False]),
        amqp([None, None, {1: "a"}, None, [], None, False]),
        amqp([None, None, None, None, [["lisp", "(a)"]], None, False]),
        amqp([None, None, None, None, [], [1], False]),
        amqp([None, None, None, None, [], None, 1]),
    ],
)
def test_a_malformed_set_is_a_broken_peer(value: bytes) -> None:
    with pytest.raises(ChannelError):
        decode_filter_set(value)


def _message(subject: str) -> Message:
    return Message(
        amqp(Described(0x73, [None, None, None, subject])) + amqp(Described(0x77, subject))
    )


def _owner(queue: QueueType) -> Owner:
    return Owner(lambda vhost, name: queue if name == queue.name else None, 16, clock=Clock())


def _attach(owner: Owner, filters: FilterSet, queue: str = "q") -> list[object]:
    frame = Attach(1, "/", queue, True, False, 0, encode_filter_set(filters, LIMIT))
    data = b"".join(encode(frame))
    (read,) = FrameReader(LIMIT).feed(data)
    frames, _ = owner.receive(read)
    return list(frames)


def test_the_owner_filters_a_classic_queue_as_a_local_attach_would() -> None:
    queue = ClassicQueue("q")
    for subject in ("red", "blue", "red", "green"):
        queue.enqueue(_message(subject))
    owner = _owner(queue)
    assert _attach(owner, FilterSet(expressions=(("sql", "properties.subject = 'red'"),))) == [
        Attached(1)
    ]
    frames, _ = owner.receive(Credit(1, 0, 10, False, False))
    deliveries = frames[0]
    assert isinstance(deliveries, Deliveries)
    assert len(deliveries.seqs) == 2
    assert isinstance(frames[-1], CreditReply)


def test_an_invalid_filter_is_refused_with_the_condition_a_local_attach_gets() -> None:
    owner = _owner(ClassicQueue("q"))
    (error,) = _attach(owner, FilterSet(expressions=(("selector", "a = = 1"),)))
    assert isinstance(error, Error)
    assert error.condition == "amqp:invalid-field"
    (error,) = _attach(owner, FilterSet(properties={}))
    assert isinstance(error, Error)
    assert error.condition == "amqp:invalid-field"
    assert owner.consumers == {}


def test_a_stream_reader_starts_at_its_offset_with_the_offset_stamped() -> None:
    stream = StreamQueue("s", parse_arguments({"x-queue-type": "stream"}), clock=Clock())
    for subject in ("a", "b", "c", "d"):
        stream.enqueue(_message(subject))
    owner = _owner(stream)
    assert _attach(owner, FilterSet(offset=OffsetSpec("offset", 2)), "s") == [Attached(1)]
    frames, _ = owner.receive(Credit(1, 0, 10, False, False))
    deliveries = frames[0]
    assert isinstance(deliveries, Deliveries)
    assert [read_stream_offset(payload) for payload in deliveries.payloads] == [2, 3]
