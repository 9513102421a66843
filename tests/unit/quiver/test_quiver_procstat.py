"""Reading CPU ticks and resident pages out of /proc text."""

from __future__ import annotations

import os

from sluicegate.clients.quiver.procstat import parse_stat_ticks, parse_statm_rss_pages, sample

STAT = (
    "7566 (cat) R 7522 7522 2872 0 -1 4194304 100 0 0 0 12 30 0 0 20 0 1 0 64911 3133440 "
    "412 18446744073709551615 94617894039552 94617894059433 140737000640752 0 0 0 0 0 0 0 0 0"
)


def test_ticks_are_utime_plus_stime() -> None:
    assert parse_stat_ticks(STAT) == 42


def test_a_command_name_with_spaces_and_parentheses() -> None:
    tricky = STAT.replace("(cat)", "(my (odd) name)")
    assert parse_stat_ticks(tricky) == 42


def test_resident_pages_are_the_second_number() -> None:
    assert parse_statm_rss_pages("765 438 409 5 0 123 0\n") == 438


def test_sample_of_this_process_and_of_none() -> None:
    mine = sample(os.getpid())
    assert mine is not None
    assert mine.rss_bytes > 0
    assert sample(2**22 + 1) is None  # above Linux's pid_max limit: never a process
