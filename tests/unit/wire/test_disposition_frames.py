"""The DISPOSITION frames found in a client's bytes before proton reads them."""

from __future__ import annotations

from typing import Final

import proton
from hypothesis import given
from hypothesis import strategies as st
from support.frames import described, encode_frame, symbol_map

from sluicegate.wire.disposition_frames import (
    PROTOCOL_HEADER,
    WEIGHED_SIZE,
    Disposition,
    DispositionFrames,
)

HEADER: Final = b"AMQP\x00\x01\x00\x00"


def _modified(first: int, last: int | None, annotation: int) -> bytes:
    annotations = symbol_map({"x-opt-a": "a" * annotation})
    state = described(
        "modified", delivery_failed=True, undeliverable_here=False, message_annotations=annotations
    )
    return encode_frame(
        0,
        described(
            "disposition",
            role=True,
            first=proton.uint(first),
            last=None if last is None else proton.uint(last),
            settled=True,
            state=state,
        ),
    )


def _transfer(size: int) -> bytes:
    return encode_frame(
        0,
        described("transfer", handle=proton.uint(0), delivery_id=proton.uint(0)),
        b"p" * size,
    )


STREAM: Final = [
    (_transfer(10), None),
    (_modified(5, 3004, 100_000), Disposition(len(_modified(5, 3004, 100_000)), 3000)),
    (_transfer(5000), None),
    (_modified(7, None, 200), Disposition(len(_modified(7, None, 200)), 1)),
    (_modified(2**32 - 2, 1, 200), Disposition(len(_modified(2**32 - 2, 1, 200)), 4)),
    (_modified(0, 2**31, 0), None),  # too small to matter, whatever its range
    (b"\x00\x00\x00\x08\x02\x00\x00\x00", None),  # a heartbeat
]


def test_large_dispositions_are_found_with_their_range_and_nothing_else() -> None:
    assert len(_modified(0, 2**31, 0)) < WEIGHED_SIZE
    scanner = DispositionFrames()
    data = HEADER + b"".join(frame for frame, _ in STREAM)
    assert scanner.scan(data) == [found for _, found in STREAM if found is not None]


@given(st.lists(st.integers(min_value=1, max_value=400), max_size=40))
def test_reads_cut_anywhere_find_the_same_frames(cuts: list[int]) -> None:
    """However the bytes are cut into reads (a frame header, a body), the same dispositions
    are found, each once."""
    data = HEADER + b"".join(frame for frame, _ in STREAM)
    scanner = DispositionFrames()
    found: list[Disposition] = []
    pos = 0
    for cut in cuts:
        found += scanner.scan(data[pos : pos + cut])
        pos += cut
    found += scanner.scan(data[pos:])
    assert found == [found for _, found in STREAM if found is not None]


def test_bytes_that_are_not_framing_are_left_to_proton() -> None:
    scanner = DispositionFrames()
    assert scanner.scan(b"x" * PROTOCOL_HEADER + b"\xff" * 64) == []
    assert scanner.scan(_modified(0, 10, 1000)) == []
