"""The placement file every worker shares: one home per queue, whoever places it first, and a
line torn by a worker killed while appending cut off by the next writer (docs/workers.md)."""

from __future__ import annotations

from pathlib import Path

from sluicegate.gateway.queue_homes_file import PLACEMENT_FILE, HomesFile
from sluicegate.queues.queue_homes import Homes, proposed_home


def test_a_queue_placed_by_one_worker_has_that_home_for_every_other(tmp_path: Path) -> None:
    first, second = HomesFile(tmp_path, 2), HomesFile(tmp_path, 2)
    names = [f"q{n}" for n in range(20)]
    for name in names:
        assert first.place("/", name) == proposed_home("/", name, 2)
    # Placed later with more workers, the first's records still decide.
    wider = HomesFile(tmp_path, 4)
    assert [wider.place("/", name) for name in names] == [first.place("/", n) for n in names]
    assert [second.place("/", name) for name in names] == [first.place("/", n) for n in names]
    text = (tmp_path / PLACEMENT_FILE).read_text()
    assert len(text.splitlines()) == 20


def test_a_forgotten_queue_is_placed_anew_and_the_file_replays(tmp_path: Path) -> None:
    homes = HomesFile(tmp_path, 2)
    homes.place("/", "a")
    homes.place("/v", "b")
    homes.forget("/", "a")
    replayed = Homes.replay((tmp_path / PLACEMENT_FILE).read_text(), 2)
    assert replayed.homes == {("/v", "b"): proposed_home("/v", "b", 2)}


def test_a_torn_line_is_cut_before_the_next_record(tmp_path: Path) -> None:
    HomesFile(tmp_path, 2).place("/", "whole")
    with (tmp_path / PLACEMENT_FILE).open("a") as placement:
        placement.write('{"place": ["/", "to')
    later = HomesFile(tmp_path, 2)
    later.place("/", "after")
    replayed = Homes.replay((tmp_path / PLACEMENT_FILE).read_text(), 2)
    assert set(replayed.homes) == {("/", "whole"), ("/", "after")}
