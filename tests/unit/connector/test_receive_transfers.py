"""``receive_transfers`` against a real proton sender, the two transports joined in memory.

Frames of 512 bytes make every message above that a multi-frame transfer, and messages larger
than the scratch buffer cross it; an aborted transfer and the newest, still partial, delivery
are where reading three C calls a message could go wrong.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Connection, Delivery, Sender, Transport

from sluicegate.clients.capi import (
    COPY_EACH_FROM,
    SCRATCH_BYTES,
    ffi,
    lib,
    link_pointer,
    receive_transfers,
    take_transfers,
)

MAX_FRAME = 512
SIZES = st.sampled_from([0, 1, 300, MAX_FRAME * 3 + 1, SCRATCH_BYTES - 5, SCRATCH_BYTES * 2 + 7])


class Pair:
    """A receiver link and the sender link it is attached to, on two in-memory transports."""

    def __init__(self) -> None:
        self.transports = (Transport(), Transport(Transport.SERVER))
        self.connections = (Connection(), Connection())
        for transport, connection in zip(self.transports, self.connections, strict=True):
            transport.max_frame_size = MAX_FRAME
            transport.bind(connection)
            connection.open()
        session = self.connections[0].session()
        session.open()
        self.receiver = session.receiver("q")
        self.receiver.open()
        self.receiver.flow(1_000)
        self.move()
        remote_session = self.connections[1].session_head(0)
        assert remote_session is not None
        remote_session.open()
        sender = self.connections[1].link_head(0)
        assert isinstance(sender, Sender)
        self.sender = sender
        self.sender.open()
        self.move()
        self.link = link_pointer(self.receiver)
        self._tags = 0

    def move(self) -> None:
        """Carry every byte either transport has to write to the other."""
        moved = True
        while moved:
            moved = False
            for source, sink in (self.transports, self.transports[::-1]):
                while (pending := source.pending()) > 0:
                    piece = source.peek(min(pending, sink.capacity()))
                    assert piece is not None
                    sink.push(piece)
                    source.pop(len(piece))
                    moved = True

    def start(self, payload: bytes) -> Delivery:
        """A delivery with ``payload`` sent, not yet complete."""
        self._tags += 1
        delivery = self.sender.delivery(str(self._tags))
        self.sender.send(payload)
        return delivery

    def send(self, payload: bytes) -> None:
        self.start(payload)
        self.sender.advance()


def _payload(index: int, size: int) -> bytes:
    return bytes((index + offset) % 251 for offset in range(size))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(SIZES, st.booleans()), max_size=8), st.integers(1, 10))
def test_complete_messages_come_back_to_back_and_aborted_ones_are_dropped(
    plan: list[tuple[int, bool]], limit: int
) -> None:
    pair = Pair()
    expected = []
    aborted = 0
    for index, (size, abort) in enumerate(plan):
        payload = _payload(index, size)
        if abort:
            delivery = pair.start(payload + b"a" * MAX_FRAME)
            pair.move()
            delivery.abort()
            aborted += 1
        else:
            pair.send(payload)
            expected.append(payload)
        pair.move()
    data = bytearray()
    sizes = array("I")
    deliveries: list[Any] = []
    dropped = 0
    while True:
        taken, lost = receive_transfers(pair.link, limit, False, data, sizes)
        assert len(taken) + lost <= limit
        if not taken and not lost:
            break
        deliveries += taken
        dropped += lost
    assert bytes(data) == b"".join(expected)
    assert list(sizes) == [len(payload) for payload in expected]
    assert dropped == aborted
    assert len(deliveries) == len(expected)


def test_the_newest_delivery_waits_until_it_is_complete() -> None:
    pair = Pair()
    pair.send(b"first")
    pair.start(b"x" * (MAX_FRAME * 2))
    pair.move()
    assert lib.pn_link_queued(pair.link) == 2
    _, payloads, dropped = take_transfers(pair.link, 10, settle=True)
    assert (payloads, dropped) == ([b"first"], 0)
    assert take_transfers(pair.link, 10, settle=True)[1:] == ([], 0)
    pair.sender.send(b"y")
    pair.sender.advance()
    pair.move()
    _, payloads, _ = take_transfers(pair.link, 10, settle=True)
    assert payloads == [b"x" * (MAX_FRAME * 2) + b"y"]


@pytest.mark.parametrize("size", [SCRATCH_BYTES, SCRATCH_BYTES * 3])
def test_a_message_that_fills_the_scratch_buffer_exactly_is_read_whole(size: int) -> None:
    pair = Pair()
    payloads = [_payload(1, size), b"after"]
    for payload in payloads:
        pair.send(payload)
    pair.move()
    data = bytearray(b"kept")
    sizes = array("I")
    receive_transfers(pair.link, 10, False, data, sizes)
    assert bytes(data) == b"kept" + b"".join(payloads)
    assert list(sizes) == [size, 5]
    assert lib.pn_link_current(pair.link) == ffi.NULL


@pytest.mark.parametrize(
    "sizes",
    [
        [0, 1, 300],  # sliced from one copy of the pass
        [COPY_EACH_FROM, 0, COPY_EACH_FROM * 2],  # copied each from a view of the pass
        [SCRATCH_BYTES * 2 + 7, 5],
    ],
)
def test_take_transfers_gives_each_message_as_its_own_bytes(sizes: list[int]) -> None:
    pair = Pair()
    sent = [_payload(index, size) for index, size in enumerate(sizes)]
    for payload in sent:
        pair.send(payload)
    pair.move()
    deliveries, payloads, dropped = take_transfers(pair.link, 10, settle=True)
    assert payloads == sent
    assert all(type(payload) is bytes for payload in payloads)
    assert (len(deliveries), dropped) == (len(sent), 0)
