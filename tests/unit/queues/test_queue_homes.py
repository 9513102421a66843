"""Queue placement over workers: stable across processes and restarts, recorded once, never
moved by a change in the number of workers (issue 35)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.queue_homes import Homes, HomesDamaged, proposed_home

NAMES = st.text(min_size=1, max_size=30)


def test_the_proposed_home_is_the_same_in_another_process() -> None:
    names = [f"queue-{n}" for n in range(50)]
    here = [proposed_home("/", name, 7) for name in names]
    code = (
        "from sluicegate.queues.queue_homes import proposed_home;"
        f"print([proposed_home('/', n, 7) for n in {names!r}])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert there.strip() == repr(here)


def test_names_spread_over_every_worker() -> None:
    counts = Counter(proposed_home("/", f"q{n}", 4) for n in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    # 1,000 expected each; a hash that favoured a worker by a fifth would fail.
    assert all(800 <= count <= 1200 for count in counts.values())


@given(NAMES, NAMES, st.integers(1, 63))
def test_one_more_worker_moves_a_proposal_only_to_the_new_worker(
    vhost: str, name: str, workers: int
) -> None:
    before = proposed_home(vhost, name, workers)
    after = proposed_home(vhost, name, workers + 1)
    assert 0 <= before < workers
    assert after in (before, workers)


@given(st.lists(st.tuples(NAMES, NAMES), max_size=20), st.integers(1, 8), st.integers(1, 8))
def test_a_recorded_home_survives_a_restart_with_any_number_of_workers(
    queues: list[tuple[str, str]], workers: int, later: int
) -> None:
    homes = Homes(workers)
    text = ""
    for vhost, name in queues:
        home, record = homes.place(vhost, name)
        if record is not None:
            text += record
        assert homes.place(vhost, name) == (home, None)
    again = Homes.replay(text, later)
    assert again.homes == homes.homes
    assert again.stranded() == sorted(
        (vhost, name, home) for (vhost, name), home in homes.homes.items() if home >= later
    )


def test_a_forgotten_queue_is_placed_afresh_and_compaction_keeps_only_the_living() -> None:
    homes = Homes(1)
    text = homes.place("/", "a")[1] or ""
    text += homes.place("v", "b")[1] or ""
    text += homes.forget("/", "a") or ""
    assert homes.forget("/", "a") is None
    replayed = Homes.replay(text, 1)
    assert replayed.homes == {("v", "b"): 0}
    assert Homes.replay(replayed.compacted(), 1).homes == replayed.homes


def test_a_torn_last_record_is_left_out_and_damage_is_named() -> None:
    homes = Homes(2)
    whole = homes.place("/", "a")[1] or ""
    torn = (homes.place("/", "b")[1] or "")[:-5]
    assert Homes.replay(whole + torn, 2).homes == {("/", "a"): homes.homes[("/", "a")]}
    with pytest.raises(HomesDamaged, match="line 2"):
        Homes.replay(whole + "{not json\n", 2)
    with pytest.raises(HomesDamaged, match="line 1"):
        Homes.replay('{"place": ["/", "a"], "worker": -1}\n', 2)


@given(
    st.lists(st.tuples(st.sampled_from(["/", "v"]), NAMES), max_size=40, unique=True),
    st.integers(2, 6),
    st.integers(1, 5),
)
def test_a_rehome_moves_only_the_stranded_and_leaves_none(
    queues: list[tuple[str, str]], workers: int, fewer: int
) -> None:
    homes = Homes(workers)
    text = "".join(record for vhost, name in queues if (record := homes.place(vhost, name)[1]))
    shrunk = Homes.replay(text, fewer)
    stranded = shrunk.stranded()
    moves = shrunk.rehome()
    assert [(vhost, name, old) for vhost, name, old, _ in moves] == stranded
    assert shrunk.stranded() == []
    for vhost, name, _, new in moves:
        assert new == proposed_home(vhost, name, fewer)
    # Every other queue keeps its home; the rewritten file says the same after a restart.
    kept = {key: home for key, home in homes.homes.items() if home < fewer}
    assert {key: shrunk.homes[key] for key in kept} == kept
    assert Homes.replay(shrunk.compacted(), fewer).homes == shrunk.homes
