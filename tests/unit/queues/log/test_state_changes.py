"""Changes logged for many messages at once (``acquire_all``, ``settle_all``) buffer exactly the
runs, live-message counts and acquisitions that logging them one at a time does, records split
where one would be full."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.log import changes
from sluicegate.queues.log.changes import StateChanges
from sluicegate.queues.log.records import RecordType

# A record's worth of ids small enough for short lists to fill several.
_SMALL_RECORD = 3

_ids = st.lists(st.integers(0, 40), max_size=8)
_steps = st.lists(
    st.tuples(st.sampled_from(["acquire", "settle", "count", "give_back"]), _ids, st.booleans()),
    max_size=12,
)


def _runs(state: StateChanges) -> list[tuple[RecordType, list[int], list[int]]]:
    return [(run.kind, run.ids, run.segments) for run in state.buffer]


@given(steps=_steps)
def test_many_at_once_buffer_what_one_by_one_does(steps: list[tuple[str, list[int], bool]]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(changes, "_IDS_PER_RECORD", _SMALL_RECORD)
        single, bulk = StateChanges(), StateChanges()
        for kind, ids, at_once in steps:
            segments = [message_id // 10 for message_id in ids]
            for message_id, segment in zip(ids, segments, strict=True):
                if kind == "count":
                    single.count(message_id, segment, 2)
                    bulk.count(message_id, segment, 2)
                elif kind == "give_back":
                    single.give_back(message_id, segment)
                    bulk.give_back(message_id, segment)
                else:
                    getattr(single, kind)(message_id, segment)
            if kind in ("acquire", "settle"):
                if at_once:
                    getattr(bulk, f"{kind}_all")(ids, segments)
                else:
                    for message_id, segment in zip(ids, segments, strict=True):
                        getattr(bulk, kind)(message_id, segment)
        assert _runs(bulk) == _runs(single)
        assert all(len(run.ids) <= _SMALL_RECORD for run in bulk.buffer)
        assert bulk.counts == single.counts
        assert bulk.acquired == single.acquired


def test_a_full_record_of_settlements_starts_the_next() -> None:
    state = StateChanges()
    ids = list(range(changes._IDS_PER_RECORD + 5))
    state.settle(7, 0)
    state.settle_all(ids, [1] * len(ids))
    sizes = [len(run.ids) for run in state.buffer]
    assert sizes == [changes._IDS_PER_RECORD, 6]
    assert state.buffer[0].ids[:2] == [7, 0]
