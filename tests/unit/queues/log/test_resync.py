"""Finding valid records again after damage: the same answer as trying every offset, in work
linear in the data, and bounded whatever the bodies hold."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from sluicegate.queues.log.damage import Resynced, resync, valid_run
from sluicegate.queues.log.records import (
    HEADER_SIZE,
    KINDS,
    U32,
    RecordType,
    encode_messages_changed,
    encode_segment_start,
    enqueue_prefix,
)

MiB = 1 << 20


def _enqueue(message_id: int, payload: bytes) -> bytes:
    return enqueue_prefix(message_id, "q", 0, payload) + payload


def _exhaustive(data: bytes, pos: int) -> tuple[int, int] | None:
    """Every offset after ``pos`` in turn (the damaged record's own length first), each with
    a run of records decoded to the end: what a search must find."""
    size = len(data)
    if pos + HEADER_SIZE <= size:
        length = U32.unpack_from(data, pos)[0]
        start = pos + 8 + length
        if length > 0 and start < size and (found := valid_run(data, start)):
            return start, found
    for start in range(pos + 1, size - HEADER_SIZE + 1):
        length = U32.unpack_from(data, start)[0]
        if 0 < length <= size - start - 8 and data[start + 8] in KINDS:
            found = valid_run(data, start)
            if found:
                return start, found
    return None


def _found(result: Resynced | None) -> tuple[int, int] | None:
    return None if result is None else (result.offset, result.records)


# Pieces of a segment: records (some with records inside their bodies), junk, and records cut.
_records = st.one_of(
    st.builds(_enqueue, st.integers(0, 2**64 - 1), st.binary(max_size=64)),
    st.builds(
        lambda ids: encode_messages_changed(RecordType.SETTLE, ids),
        st.lists(st.integers(0, 2**64 - 1), max_size=4),
    ),
    st.builds(encode_segment_start, st.integers(0, 99), st.integers(0, 99), st.just([1, 2])),
)
_pieces = st.one_of(
    _records,
    st.builds(lambda inner: _enqueue(7, inner), _records),
    st.binary(min_size=1, max_size=24),
    st.builds(lambda record, cut: record[:cut], _records, st.integers(1, 40)),
)


@settings(max_examples=examples(300), deadline=None)
@given(pieces=st.lists(_pieces, min_size=1, max_size=12), data=st.data())
def test_resync_finds_what_trying_every_offset_finds(
    pieces: list[bytes], data: st.DataObject
) -> None:
    segment = b"".join(pieces)
    pos = data.draw(st.integers(0, len(segment) - 1))
    assert _found(resync(segment, pos)) == _exhaustive(segment, pos)


def test_a_record_whose_length_is_damaged_is_skipped_checking_little_more_than_the_data() -> None:
    """A random 1 MiB body holds plausible headers by chance; the records after it are found."""
    records = [_enqueue(i, b"x" * 100) for i in range(2000)]
    large = _enqueue(2000, os.urandom(MiB))
    records.insert(1000, large)
    segment = bytearray(b"".join(records))
    damaged = sum(len(r) for r in records[:1000])
    segment[damaged] = 0x7F  # the length's high byte: past any record's size
    found = resync(bytes(segment), damaged)
    assert found is not None
    assert (found.offset, found.records) == (damaged + len(large), 1000)
    assert found.verified
    assert found.checked < 2 * len(segment)


def test_a_body_crafted_to_be_checked_again_and_again_costs_a_bounded_search() -> None:
    """Every 64 bytes a header whose record runs exactly to the end and whose fields decode:
    checking each one's CRC would read the data some 8,000 times over."""
    size = MiB
    segment = bytearray(size)
    for pos in range(64, size - 64, 64):
        length = size - pos - 8
        segment[pos : pos + HEADER_SIZE] = U32.pack(length) + b"\0\0\0\0" + bytes((8,))
    found = resync(bytes(segment), 0)
    assert found is not None
    # The work stops at its budget; past it the run still counts as records that follow, so
    # recovery refuses (an operator repairs) rather than cutting them as a torn tail.
    assert not found.verified
    assert found.records >= 1
    assert found.checked <= 64 * size + 1


def test_a_tail_of_zeros_or_random_bytes_holds_no_records() -> None:
    head = b"".join(_enqueue(i, b"y" * 50) for i in range(10))
    for tail in (bytes(MiB), os.urandom(MiB)):
        damaged = head + tail
        assert resync(damaged, len(head)) is None
    # A valid record after the junk is found past it.
    last = _enqueue(99, b"z")
    assert _found(resync(head + bytes(1000) + last, len(head))) == (len(head) + 1000, 1)
