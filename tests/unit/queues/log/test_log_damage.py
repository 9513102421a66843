"""The log is never repaired silently: a torn tail is cut and reported, anything else refuses.

Each test writes a log of several segments with the store itself, damages it as a crash or an
operator might, and checks what opening it does, what ``check`` reports and what ``repair``
drops.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.examples import examples

from sluicegate.queues.log.check import check, repair
from sluicegate.queues.log.damage import LogDamaged
from sluicegate.queues.log.decoding import iter_records
from sluicegate.queues.log.records import (
    RecordType,
    SegmentEnd,
    encode_segment_end,
    frame_record,
)
from sluicegate.queues.log.segments import (
    CLEAN_SHUTDOWN,
    SegmentWriter,
    list_segments,
    segment_path,
)
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

# Small segments: 60 messages of ~230 bytes fill several of them.
_SEGMENT = 2048
_COUNT = 60


def _payload(i: int) -> bytes:
    return encode(Described(0x77, f"m{i}-" + "x" * 200))


def _log(directory: Path, *, clean: bool) -> list[StoredMessage]:
    """A log of ``_COUNT`` live messages over several segments, closed cleanly or not."""
    store = MessageStore(directory, segment_size=_SEGMENT)
    writer = SegmentWriter(directory)
    store.declare_queue("q", {})
    messages = []
    for i in range(_COUNT):
        messages.append(store.enqueue("q", _payload(i), i))
        if i % 10 == 9:
            write_now(store, writer)
    write_now(store, writer)
    writer.close()
    store.close(clean=clean)
    return messages


def _recovered(directory: Path) -> list[int]:
    store = MessageStore(directory, segment_size=_SEGMENT)
    ids = [m.message_id for m in store.iter_recovered_messages("q")]
    store.close()
    return ids


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_clean_log_opens_and_checks_clean(tmp_path: Path) -> None:
    messages = _log(tmp_path, clean=True)
    report = check(tmp_path)
    assert report.startable
    assert report.clean_shutdown
    assert report.lines()[-1] == "no damage; closed cleanly"
    assert _recovered(tmp_path) == [m.message_id for m in messages]
    # Opening the log again removes the marker: from now on a crash may tear its end.
    assert not (tmp_path / CLEAN_SHUTDOWN).exists()


def test_a_torn_tail_after_a_crash_is_cut_and_reported_with_its_bytes(tmp_path: Path) -> None:
    messages = _log(tmp_path, clean=False)
    last = segment_path(tmp_path, list_segments(tmp_path)[-1])
    size = last.stat().st_size
    with last.open("ab") as file:
        file.write(b"\x00\x00\x01\x00\xde\xad\xbe")  # a record header the crash cut short
    store = MessageStore(tmp_path, segment_size=_SEGMENT)
    torn = store.recovered.torn_tail
    assert torn is not None
    assert (torn.offset, torn.dropped_bytes) == (size, 7)
    assert store.statistics().truncated_bytes == 7
    assert last.stat().st_size == size
    assert [m.message_id for m in store.iter_recovered_messages("q")] == [
        m.message_id for m in messages
    ]


def test_a_damaged_last_record_with_nothing_after_it_is_a_torn_tail(tmp_path: Path) -> None:
    messages = _log(tmp_path, clean=False)
    final = messages[-1]
    _flip(segment_path(tmp_path, final.segment), final.offset + 5)
    report = check(tmp_path)
    assert report.startable
    assert report.state.torn_tail is not None
    assert _recovered(tmp_path) == [m.message_id for m in messages[:-1]]


@pytest.mark.parametrize("kept_records", [1, 2, 4])
def test_a_middle_segment_cut_at_a_record_boundary_refuses_and_repair_closes_it(
    tmp_path: Path, kept_records: int
) -> None:
    """Every record left is whole and its CRC right, so only the end record the next segment's
    header promises shows the cut: confirmed messages were lost, and the log refuses."""
    messages = _log(tmp_path, clean=False)
    victim = list_segments(tmp_path)[1]
    path = segment_path(tmp_path, victim)
    data = path.read_bytes()
    offsets = [offset for offset, _ in iter_records(data)]
    assert isinstance(list(iter_records(data))[-1][1], SegmentEnd)
    cut = offsets[kept_records]
    path.write_bytes(data[:cut])
    report = check(tmp_path)
    assert not report.startable
    [damage] = report.state.damages
    assert (damage.segment, damage.offset) == (victim, cut)
    assert f"no end record, though segment {victim + 1} follows it" in damage.reason
    with pytest.raises(LogDamaged):
        MessageStore(tmp_path, segment_size=_SEGMENT)
    repair(tmp_path)
    if any(m.segment == victim and m.record < cut for m in messages):
        assert path.read_bytes() == data[:cut] + encode_segment_end(victim)
    else:
        assert not path.exists()  # nothing live was left in it: compaction deleted it
    assert check(tmp_path).startable
    lost = {m.message_id for m in messages if m.segment == victim and m.record >= cut}
    assert set(_recovered(tmp_path)) == {m.message_id for m in messages} - lost


def test_a_record_after_a_segment_s_end_refuses(tmp_path: Path) -> None:
    _log(tmp_path, clean=False)
    first = segment_path(tmp_path, list_segments(tmp_path)[0])
    with first.open("ab") as file:
        file.write(encode_segment_end(list_segments(tmp_path)[0]))
    [damage] = check(tmp_path).state.damages
    assert "a record follows the segment's end record" in damage.reason


def test_a_log_whose_segments_have_no_end_records_still_opens_and_is_closed_from_then_on(
    tmp_path: Path,
) -> None:
    """An older server's log (type-17 headers, no end records) is not refused for lacking what
    it never wrote; the next start closes its last segment before opening one with type 22."""
    messages = _log(tmp_path, clean=False)
    for number in list_segments(tmp_path):
        path = segment_path(tmp_path, number)
        data = path.read_bytes()
        records = list(iter_records(data))
        old = b""
        for index, (offset, record) in enumerate(records):
            end = records[index + 1][0] if index + 1 < len(records) else len(data)
            raw = data[offset:end]
            if isinstance(record, SegmentEnd):
                continue
            if index == 0:
                raw = frame_record(RecordType.SEGMENT_LIVE, raw[9:])
            old += raw
        path.write_bytes(old)
    last = list_segments(tmp_path)[-1]
    assert check(tmp_path).startable
    store = MessageStore(tmp_path, segment_size=_SEGMENT)
    writer = SegmentWriter(tmp_path)
    write_now(store, writer)
    writer.close()
    store.close()
    assert segment_path(tmp_path, last).read_bytes().endswith(encode_segment_end(last))
    assert check(tmp_path).startable
    assert _recovered(tmp_path) == [m.message_id for m in messages]


def test_a_bit_flip_inside_the_last_segment_refuses_naming_what_follows(tmp_path: Path) -> None:
    messages = _log(tmp_path, clean=False)
    last = list_segments(tmp_path)[-1]
    in_last = [m for m in messages if m.segment == last]
    victim = in_last[1]
    _flip(segment_path(tmp_path, last), victim.offset + 3)
    with pytest.raises(LogDamaged) as refused:
        MessageStore(tmp_path, segment_size=_SEGMENT)
    [damage] = refused.value.damages
    assert (damage.segment, damage.offset) == (last, victim.record)
    assert damage.following == len(in_last) - 2
    assert f"segment {last} at offset {victim.record}: CRC mismatch" in str(refused.value)
    assert f"{len(in_last) - 2} valid records follow" in str(refused.value)


def test_a_damaged_earlier_segment_refuses_and_counts_the_later_ones(tmp_path: Path) -> None:
    messages = _log(tmp_path, clean=True)
    segments = list_segments(tmp_path)
    victim = next(m for m in messages if m.segment == segments[1])
    _flip(segment_path(tmp_path, victim.segment), victim.offset + 1)
    with pytest.raises(LogDamaged) as refused:
        MessageStore(tmp_path, segment_size=_SEGMENT)
    assert f"and {len(segments) - 2} later segments" in str(refused.value)


def test_a_missing_middle_segment_refuses(tmp_path: Path) -> None:
    _log(tmp_path, clean=False)
    segments = list_segments(tmp_path)
    segment_path(tmp_path, segments[2]).unlink()
    with pytest.raises(LogDamaged) as refused:
        MessageStore(tmp_path, segment_size=_SEGMENT)
    assert f"segment {segments[2]}: missing (segment {segments[-1]} lists it)" in str(refused.value)


@pytest.mark.parametrize("fault", ["emptied", "deleted"])
def test_a_last_segment_emptied_or_deleted_after_a_clean_stop_refuses(
    tmp_path: Path, fault: str
) -> None:
    _log(tmp_path, clean=True)
    last = segment_path(tmp_path, list_segments(tmp_path)[-1])
    if fault == "emptied":
        last.write_bytes(b"")
    else:
        last.unlink()
    report = check(tmp_path)
    assert not report.startable
    with pytest.raises(LogDamaged):
        MessageStore(tmp_path, segment_size=_SEGMENT)


def test_segments_compaction_deleted_are_not_missing(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=_SEGMENT)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    kept = store.enqueue("q", _payload(0), 0)
    for i in range(1, _COUNT):
        store.settled(store.enqueue("q", _payload(i), i))
        write_now(store, writer)
    write_now(store, writer)
    assert len(list_segments(tmp_path)) < store.segment
    report = check(tmp_path)
    assert report.startable
    assert not report.state.damages
    assert _recovered(tmp_path) == [kept.message_id]


def test_repair_cuts_the_damage_says_what_it_dropped_and_the_log_opens(tmp_path: Path) -> None:
    messages = _log(tmp_path, clean=True)
    segments = list_segments(tmp_path)
    in_second = [m for m in messages if m.segment == segments[1]]
    victim = in_second[2]
    _flip(segment_path(tmp_path, victim.segment), victim.offset + 9)
    segment_path(tmp_path, segments[3]).unlink()
    report = repair(tmp_path)
    text = "\n".join(report.lines())
    assert f"cut segment {segments[1]} at offset {victim.record}" in text
    assert f"{len(in_second) - 3} messages of queue 'q'" in text
    assert f"segment {segments[3]} is missing" in text
    lost = {m.message_id for m in in_second[2:]} | {
        m.message_id for m in messages if m.segment == segments[3]
    }
    assert _recovered(tmp_path) == [m.message_id for m in messages if m.message_id not in lost]
    assert check(tmp_path).startable


def test_two_damages_in_one_segment_are_cut_at_the_first_and_never_lengthen_it(
    tmp_path: Path,
) -> None:
    """A last segment cut inside a record after a clean stop has two damages, a torn record and
    a length short of what the stop left: repair cuts at the first and leaves the second alone
    (truncating to it again wrote a zero byte back, and the repaired log did not start). The
    segment then ends with its end record, as the next segment's header says it does."""
    messages = _log(tmp_path, clean=True)
    last = list_segments(tmp_path)[-1]
    path = segment_path(tmp_path, last)
    path.write_bytes(path.read_bytes()[:362])
    assert len(check(tmp_path).state.damages) == 2
    report = repair(tmp_path)
    assert any("nothing past offset 362 to cut" in line for line in report.lines())
    end = encode_segment_end(last)
    repaired = path.read_bytes()
    assert repaired.endswith(end)
    assert len(repaired) - len(end) < 362
    assert check(tmp_path).startable
    kept = _recovered(tmp_path)
    assert kept == [m.message_id for m in messages if m.message_id in set(kept)]
    assert {m.message_id for m in messages if m.segment != last} <= set(kept)


# -- any tampering (issue 31) ----------------------------------------------------------------

_STRAYS = ("1.seg", "02.seg", "\u00b2.seg", "7.seg", "0000.seg", "x.seg")
_TAMPERING = st.one_of(
    st.tuples(st.just("empty"), st.integers(0, 99)),
    st.tuples(st.just("delete"), st.integers(0, 99)),
    st.tuples(st.just("stray"), st.integers(0, 99), st.sampled_from(_STRAYS)),
    st.tuples(st.just("cut"), st.integers(0, 99), st.integers(0, 3000)),
    st.tuples(st.just("flip"), st.integers(0, 99), st.integers(0, 3000)),
    st.tuples(st.just("zeros"), st.integers(0, 99), st.integers(1, 3000)),
    st.tuples(st.just("marker"), st.binary(max_size=50)),
)


def _tamper(directory: Path, tampering: tuple[object, ...]) -> None:
    kind = tampering[0]
    if kind == "marker":
        (directory / CLEAN_SHUTDOWN).write_bytes(bytes(tampering[1]))  # type: ignore[call-overload]
        return
    segments = list_segments(directory)
    if not segments:
        return
    path = segment_path(directory, segments[int(tampering[1]) % len(segments)])  # type: ignore[call-overload]
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "delete":
        path.unlink()
    elif kind == "stray":
        (directory / str(tampering[2])).write_bytes(data)
    elif kind == "cut":
        path.write_bytes(data[: int(tampering[2]) % (len(data) + 1)])  # type: ignore[call-overload]
    elif kind == "flip" and data:
        _flip(path, int(tampering[2]) % len(data))  # type: ignore[call-overload]
    elif kind == "zeros":
        path.write_bytes(data + bytes(int(tampering[2])))  # type: ignore[call-overload]


@settings(max_examples=examples(80), deadline=None)
@given(tamperings=st.lists(_TAMPERING, min_size=1, max_size=4), clean=st.booleans())
# A middle segment cut where a record ends: it went unseen before segments had end records.
@example(tamperings=[("cut", 1, 37)], clean=False)
def test_whatever_is_done_to_the_log_no_message_comes_back_twice_or_is_lost_silently(
    tmp_path_factory: pytest.TempPathFactory,
    tamperings: list[tuple[object, ...]],
    clean: bool,
) -> None:
    """``check`` reports any directory without raising; the store opens only a log whose
    losses a crash explains (the last segment's messages), else refuses; ``repair`` makes it
    startable; and no message is ever recovered twice."""
    directory = tmp_path_factory.mktemp("tampered")
    messages = _log(directory, clean=clean)
    last = list_segments(directory)[-1]
    for tampering in tamperings:
        _tamper(directory, tampering)
    # A deleted last segment leaves nothing to tell it existed (no later segment, no marker of
    # an unclean stop): the segment before it is then the last, whose tail a crash may tear.
    remaining = list_segments(directory)
    last = min(last, remaining[-1]) if remaining else last
    report = check(directory)
    assert report.lines()
    if report.startable:
        ids = _recovered(directory)
        # Startable by itself: only what a crash could have torn off is gone.
        lost = {m.message_id for m in messages} - set(ids)
        assert lost <= {m.message_id for m in messages if m.segment >= last}
    else:
        with pytest.raises(LogDamaged):
            MessageStore(directory, segment_size=_SEGMENT)
        repaired = repair(directory)
        assert repaired.repaired
        assert check(directory).startable, check(directory).lines()
        ids = _recovered(directory)
    assert len(ids) == len(set(ids))
    assert ids == sorted(ids)
    assert set(ids) <= {m.message_id for m in messages}
