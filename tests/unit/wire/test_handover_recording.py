"""The bytes of a connection that may be handed to another worker (wire/handover.py): its first
ATTACH kept from proton whole, everything else let through, the bounds, and the messages."""

from __future__ import annotations

from typing import Final

import proton
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.frames import described, encode_frame

from sluicegate.wire.handover import (
    MAX_RECORDED,
    Expected,
    HandoverError,
    Kind,
    Message,
    Recording,
    attach_address,
    decode_message,
    encode,
)

HEADER: Final = b"AMQP\x00\x01\x00\x00"
HEARTBEAT: Final = b"\x00\x00\x00\x08\x02\x00\x00\x00"
OPEN: Final = encode_frame(0, described("open", container_id="client"))
BEGIN: Final = encode_frame(
    0,
    described(
        "begin",
        next_outgoing_id=proton.uint(0),
        incoming_window=proton.uint(100),
        outgoing_window=proton.uint(100),
    ),
)
FLOW: Final = encode_frame(
    0, described("flow", next_incoming_id=proton.uint(0), incoming_window=proton.uint(9))
)


def _attach(receiver: bool, address: str | None) -> bytes:
    terminus = described("source" if receiver else "target", address=address)
    performative = (
        described("attach", name="l", handle=proton.uint(0), role=True, source=terminus)
        if receiver
        else described("attach", name="l", handle=proton.uint(0), role=False, target=terminus)
    )
    return encode_frame(0, performative)


CONSUMER: Final = _attach(True, "/queues/far")


def _whole(recording: Recording) -> bytes | None:
    """The ATTACH held, read through a call so that each read is fresh to the type checker."""
    return recording.attach


def _done(expected: Expected) -> bool:
    return expected.done


def _count(noticed: _Noticed) -> int:
    return noticed.count


class _Noticed:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _fed(stream: bytes, cuts: list[int]) -> tuple[Recording, bytes, _Noticed]:
    noticed = _Noticed()
    recording = Recording(noticed)
    passed = b""
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        passed += recording.inbound(stream[start:cut])
        start = cut
    return recording, passed, noticed


@given(st.lists(st.integers(0, 400), max_size=8))
def test_the_first_attach_and_what_follows_are_kept_whole_however_the_bytes_come(
    cuts: list[int],
) -> None:
    before = HEADER + OPEN + HEARTBEAT + BEGIN
    recording, passed, noticed = _fed(before + CONSUMER + FLOW, cuts)
    assert passed == before
    assert recording.attach == CONSUMER
    assert bytes(recording.held or b"") == CONSUMER + FLOW
    assert noticed.count == 1
    assert not recording.over
    # Given up, proton gets the rest in order.
    assert recording.give_up() == CONSUMER + FLOW


@pytest.mark.parametrize(
    "stream",
    [
        HEADER + OPEN + BEGIN + FLOW + CONSUMER,  # another frame before the first ATTACH
        HEADER + OPEN + BEGIN + BEGIN + CONSUMER,  # a second session
        HEADER + BEGIN + CONSUMER,  # no OPEN
        b"AMQP\x03\x01\x00\x00" + OPEN,  # not the AMQP header
    ],
)
def test_a_connection_that_is_not_open_begin_attach_is_let_through(stream: bytes) -> None:
    recording, passed, noticed = _fed(stream, [len(stream) // 2])
    assert recording.over
    assert passed + recording.give_up() == stream
    assert noticed.count == 0


def test_an_attach_not_whole_yet_is_not_noticed() -> None:
    recording, passed, noticed = _fed(HEADER + OPEN + BEGIN + CONSUMER[:-1], [])
    assert passed == HEADER + OPEN + BEGIN
    assert _whole(recording) is None
    assert _count(noticed) == 0
    recording.inbound(CONSUMER[-1:])
    assert _whole(recording) == CONSUMER
    assert _count(noticed) == 1


def test_more_than_the_bound_recorded_ends_the_recording() -> None:
    recording = Recording(_Noticed())
    recording.took(b"x" * (MAX_RECORDED // 2))
    assert recording.size == MAX_RECORDED // 2
    recording.wrote(b"y" * (MAX_RECORDED // 2 + 1))
    assert recording.over
    assert recording.size == 0
    recording.took(b"z")
    assert recording.size == 0
    assert recording.inbound(HEADER) == HEADER


@pytest.mark.parametrize(
    ("frame", "receiver", "address"),
    [
        (CONSUMER, True, "/queues/far"),
        (_attach(False, "/queues/q"), False, "/queues/q"),
        (_attach(True, None), True, None),
    ],
)
def test_the_attach_names_its_role_and_queue(
    frame: bytes, receiver: bool, address: str | None
) -> None:
    link = attach_address(frame)
    assert link is not None
    assert (link.receiver, link.address) == (receiver, address)


def test_a_frame_that_is_not_an_attach_names_nothing() -> None:
    assert attach_address(FLOW) is None
    assert attach_address(FLOW[:8] + b"\xff") is None


def test_the_taker_checks_its_output_byte_for_byte() -> None:
    expected = Expected(b"abcdef")
    expected.take(b"ab")
    expected.take(b"cd")
    assert not _done(expected)
    expected.take(b"ef")
    assert _done(expected)
    expected.take(b"g")
    assert expected.failed
    wrong = Expected(b"abc")
    wrong.take(b"abd")
    assert wrong.failed
    assert not wrong.done


def test_messages_round_trip_and_broken_ones_are_refused() -> None:
    offer = Message(Kind.OFFER, 1, 7, 12.5, b"read-bytes", 5, b"written")
    assert decode_message(encode(offer)) == offer
    ready = Message(Kind.READY, 0, 7, 0.0)
    assert decode_message(encode(ready)) == ready
    data = encode(offer)
    for broken in (data[:5], data[:-1], data + b"x", b"\x09" + data[1:], encode(ready) + b"x"):
        with pytest.raises(HandoverError):
            decode_message(broken)
    too_much = Message(Kind.OFFER, 1, 7, 0.0, b"r" * MAX_RECORDED, 0, b"w")
    with pytest.raises(HandoverError):
        decode_message(encode(too_much))
    held_beyond = Message(Kind.OFFER, 1, 7, 0.0, b"abc", 4, b"")
    with pytest.raises(HandoverError):
        decode_message(encode(held_beyond))
