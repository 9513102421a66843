"""Repeated link names made unique for proton and restored for the client, however bytes are cut."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from proton import uint
from support.frames import AMQP_HEADER, HEARTBEAT, Frame, described, encode_frame, parse_frame

from sluicegate.wire.link_names import LinkNames

SENDER = False
RECEIVER = True
MAX_FRAME = 65536


def attach(channel: int, name: str, handle: int, role: bool) -> bytes:
    terminus = described("target", address="/queues/q")
    return encode_frame(
        channel,
        described("attach", name=name, handle=uint(handle), role=role, target=terminus),
    )


def detach(channel: int, handle: int) -> bytes:
    return encode_frame(channel, described("detach", handle=uint(handle), closed=True))


def transfer(channel: int, handle: int, payload: bytes) -> bytes:
    fields = described("transfer", handle=uint(handle), delivery_id=uint(0), delivery_tag=b"t")
    return encode_frame(channel, fields, payload)


def end(channel: int) -> bytes:
    return encode_frame(channel, described("end"))


def frames(stream: bytes) -> list[Frame]:
    assert stream.startswith(AMQP_HEADER)
    buffer = bytearray(stream[len(AMQP_HEADER) :])
    parsed: list[Frame] = []
    while (frame := parse_frame(buffer, MAX_FRAME)) is not None:
        parsed.append(frame)
    assert not buffer
    return parsed


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    """``stream`` in pieces at the given offsets (as socket reads cut it)."""
    edges = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


def through_inbound(stream: bytes, points: list[int]) -> tuple[LinkNames, bytes]:
    names = LinkNames(MAX_FRAME)
    return names, b"".join(names.inbound(piece) for piece in cut(stream, points))


# Two publishers and a consumer of one address on one session, as RabbitMQ's client names them;
# then the first publisher detaches and a third attaches.
CLIENT = b"".join(
    [
        AMQP_HEADER,
        attach(0, "cid-/queues/q", 0, SENDER),
        attach(0, "cid-/queues/q", 1, RECEIVER),
        transfer(0, 0, b"m" * 300),
        attach(0, "cid-/queues/q", 2, SENDER),
        transfer(0, 2, b"n" * 40),
        detach(0, 0),
        attach(0, "cid-/queues/q", 3, SENDER),
        # A name that looks rewritten is made unique too, so that stripping stays exact.
        attach(0, "mine~dup0001", 4, SENDER),
        # Another session may use the same names.
        attach(1, "cid-/queues/q", 0, SENDER),
        attach(1, "cid-/queues/q", 1, SENDER),
        end(1),
        attach(1, "cid-/queues/q", 0, SENDER),
        encode_frame(
            0,
            described(
                "flow", incoming_window=uint(5), next_outgoing_id=uint(0), outgoing_window=uint(5)
            ),
        ),
    ]
)


@given(points=st.lists(st.integers(min_value=0), max_size=12))
def test_repeated_names_reach_proton_unique_in_their_session_and_role(points: list[int]) -> None:
    names, out = through_inbound(CLIENT, points)
    seen = [(f.channel, f["name"], f["role"]) for f in frames(out) if f.performative == "attach"]
    assert seen == [
        (0, "cid-/queues/q", SENDER),
        (0, "cid-/queues/q", RECEIVER),
        (0, "cid-/queues/q~dup0001", SENDER),
        # The first publisher detached: its name is free again.
        (0, "cid-/queues/q", SENDER),
        (0, "mine~dup0001~dup0001", SENDER),
        (1, "cid-/queues/q", SENDER),
        (1, "cid-/queues/q~dup0001", SENDER),
        # END freed every name of the session.
        (1, "cid-/queues/q", SENDER),
    ]
    assert names.renamed == 3
    # Everything else is as the client sent it.
    original = [f for f in frames(CLIENT) if f.performative != "attach"]
    assert [f for f in frames(out) if f.performative != "attach"] == original


def test_a_long_name_is_renamed_into_a_wider_encoding() -> None:
    name = "x" * 250
    stream = AMQP_HEADER + attach(0, name, 0, SENDER) + attach(0, name, 1, SENDER)
    _, out = through_inbound(stream, [])
    assert [f["name"] for f in frames(out)] == [name, name + "~dup0001"]


def test_bytes_that_are_not_amqp_framing_pass_untouched() -> None:
    broken = AMQP_HEADER + b"\x00\x00\x00\x04\x02\x00\x00\x00" + attach(0, "a", 0, SENDER) * 2
    _, out = through_inbound(broken, [9, 20])
    assert out == broken


def reply(name: str, handle: int, role: bool) -> bytes:
    """An ATTACH as proton writes it (proton's encoder, extended header absent)."""
    return attach(0, name, handle, role)


# What proton writes: its header, the replies to the links above, and a delivery between them.
PROTON = b"".join(
    [
        AMQP_HEADER,
        reply("cid-/queues/q", 0, RECEIVER),
        transfer(0, 1, b"d" * 5000),
        reply("cid-/queues/q~dup0001", 1, RECEIVER),
        reply("mine~dup0001~dup0001", 2, RECEIVER),
        encode_frame(0, described("detach", handle=uint(1), closed=True)),
    ]
)


CLIENT_ATTACHES = b"".join(
    [
        attach(0, "cid-/queues/q", 0, SENDER),
        attach(0, "cid-/queues/q", 1, SENDER),
        attach(0, "mine~dup0001", 2, SENDER),
    ]
)


def through_outbound(
    names: LinkNames, stream: bytes, available: list[int], taken: list[int]
) -> bytes:
    """What the client receives of proton's ``stream``, handed over and taken in pieces."""
    sent = bytearray()
    popped = 0
    for step in itertools.count():
        if popped == len(stream):
            break
        # proton's pending output, from the first byte not taken; it grows while nothing is.
        window = available[step % len(available)]
        out = names.outbound(stream[popped : popped + window])
        while not out:
            assert window < 2 * len(stream), "no progress with all of proton's output"
            window *= 2
            out = names.outbound(stream[popped : popped + window])
        assert len(out) <= window
        count = max(1, min(len(out), taken[step % len(taken)]))
        sent += out[:count]
        names.taken(count)
        popped += count
    assert len(sent) == len(stream)
    return bytes(sent)


# How much of its output proton hands over at each call, and how much of it the socket takes.
_AVAILABLE = st.lists(st.integers(min_value=1, max_value=8000), min_size=1, max_size=30)
_TAKEN = st.lists(st.integers(min_value=0, max_value=8000), min_size=1, max_size=30)


@given(available=_AVAILABLE, taken=_TAKEN)
def test_proton_replies_lose_the_suffix_at_the_same_length(
    available: list[int], taken: list[int]
) -> None:
    """However much proton hands over and the socket takes, the client reads the names it sent."""
    names = LinkNames(MAX_FRAME)
    # The client's ATTACHes proton replies to, two of them renamed on their way in.
    names.inbound(AMQP_HEADER + CLIENT_ATTACHES)
    assert names.renamed == 2
    received = frames(through_outbound(names, PROTON, available, taken))
    assert [f["name"] for f in received if f.performative == "attach"] == [
        "cid-/queues/q",
        "cid-/queues/q",
        "mine~dup0001",
    ]
    assert [f.performative for f in received] == [f.performative for f in frames(PROTON)]
    assert received[1].payload == frames(PROTON)[1].payload
    # Fields after the name survive the move into the extended header.
    assert received[2]["handle"] == 1
    assert received[2]["target"]["address"] == "/queues/q"


@given(available=_AVAILABLE, taken=_TAKEN)
def test_frames_hopped_over_before_any_rename_keep_the_replies_after_it_found(
    available: list[int], taken: list[int]
) -> None:
    """Until a name is rewritten proton's output passes as it is, and the first rename still
    finds the reply ATTACH that follows, wherever the output was cut meanwhile."""
    before = AMQP_HEADER + reply("cid-/queues/q", 0, RECEIVER) + transfer(0, 0, b"d" * 5000) * 3
    after = transfer(0, 0, b"e" * 700) + reply("cid-/queues/q~dup0001", 1, RECEIVER)
    names = LinkNames(MAX_FRAME)
    sent = through_outbound(names, before, available, taken)
    assert sent == before
    names.inbound(AMQP_HEADER + attach(0, "cid-/queues/q", 0, SENDER))
    names.inbound(attach(0, "cid-/queues/q", 1, SENDER))
    assert names.renamed == 1
    # proton's output goes on from where the client's bytes stopped.
    received = frames(sent + through_outbound(names, after, available, taken))
    assert [f["name"] for f in received if f.performative == "attach"] == ["cid-/queues/q"] * 2
    assert [f.performative for f in received] == ["attach"] + ["transfer"] * 4 + ["attach"]


def test_a_heartbeat_passes_at_once_both_ways() -> None:
    """An empty frame is whole at eight bytes: held back, it would let the idle timeout fire."""
    names = LinkNames(MAX_FRAME)
    assert names.inbound(AMQP_HEADER + HEARTBEAT) == AMQP_HEADER + HEARTBEAT
    assert names.outbound(AMQP_HEADER + HEARTBEAT) == AMQP_HEADER + HEARTBEAT
