"""A held connection's bytes: the frames that free things found, nothing else let through."""

from __future__ import annotations

from typing import Final

import proton
from hypothesis import given
from hypothesis import strategies as st
from support.frames import described, encode_frame

from sluicegate.wire.held_frames import HELD_READ, HeldFrames, Scan

HEARTBEAT: Final = b"\x00\x00\x00\x08\x02\x00\x00\x00"
CLOSE: Final = encode_frame(0, described("close"))
END: Final = encode_frame(0, described("end"))
DETACH: Final = encode_frame(0, described("detach", handle=proton.uint(0), closed=True))
DISPOSITION: Final = encode_frame(
    0, described("disposition", role=True, first=proton.uint(3), settled=True)
)
FLOW: Final = encode_frame(
    0, described("flow", next_incoming_id=proton.uint(0), incoming_window=proton.uint(9))
)


def _transfer(payload: bytes) -> bytes:
    performative = described(
        "transfer",
        handle=proton.uint(0),
        delivery_id=proton.uint(0),
        delivery_tag=b"t",
        message_format=proton.uint(0),
    )
    return encode_frame(0, performative, payload)


def _held(data: bytes) -> HeldFrames:
    held = HeldFrames()
    held.data += data
    return held


def test_frames_that_free_things_at_the_start_are_given_to_proton() -> None:
    freeing = DISPOSITION + HEARTBEAT + DETACH + END
    assert _held(freeing + CLOSE).scan(0, b"") == Scan(len(freeing + CLOSE), close=False)
    assert _held(freeing + FLOW + DETACH).scan(0, b"") == Scan(len(freeing), close=False)


def test_nothing_comes_after_a_close() -> None:
    assert _held(CLOSE + DETACH).scan(0, b"") == Scan(len(CLOSE), close=False)


def test_a_close_behind_a_transfer_closes_without_letting_the_transfer_through() -> None:
    transfer = _transfer(b"x" * 100)
    assert _held(END + transfer + DETACH + CLOSE).scan(0, b"") == Scan(len(END), close=True)


def test_the_end_of_a_frame_proton_has_begun_waits() -> None:
    transfer = _transfer(b"x" * 100)
    assert _held(transfer[40:] + DETACH).scan(len(transfer) - 40, b"") == Scan(0, close=False)
    assert _held(transfer[40:] + CLOSE).scan(len(transfer) - 40, b"") == Scan(0, close=True)
    # Proton has the first 5 bytes of a DETACH: they wait with it, but a CLOSE is still seen.
    assert _held(DETACH[5:] + CLOSE).scan(0, DETACH[:5]) == Scan(0, close=True)


def test_a_frame_cut_by_the_read_is_not_judged_until_it_is_whole() -> None:
    assert _held(DETACH + CLOSE[:10]).scan(0, b"") == Scan(len(DETACH), close=False)
    assert _held(_transfer(b"x" * 100)[:30]).scan(0, b"") == Scan(0, close=False)


def test_bytes_that_are_not_framing_are_left_for_proton_to_refuse() -> None:
    assert _held(b"\x00\x00\x00\x04\x01\x00\x00\x00" + CLOSE).scan(0, b"") == Scan(0, False)


def test_the_buffer_takes_held_read_bytes_at_most() -> None:
    held = _held(b"x" * 100)
    assert held.room == HELD_READ - 100
    assert held.pop(40) == b"x" * 40
    assert held.take() == b"x" * 60
    assert held.room == HELD_READ


@given(st.lists(st.sampled_from(["close", "end", "flow", "transfer"]), max_size=12), st.data())
def test_only_a_prefix_of_freeing_frames_is_ever_let_through(
    kinds: list[str], data: st.DataObject
) -> None:
    frames = {"close": CLOSE, "end": END, "flow": FLOW, "transfer": _transfer(b"y" * 50)}
    stream = b"".join(frames[kind] for kind in kinds)
    cut = data.draw(st.integers(0, len(stream)))
    found = _held(stream[:cut]).scan(0, b"")
    prefix = 0
    for kind in kinds:
        if kind not in ("close", "end") or prefix + len(frames[kind]) > cut:
            break
        prefix += len(frames[kind])
        if kind == "close":
            break
    assert found.free == prefix
