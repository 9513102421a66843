"""CPU time and resident memory of a process, from Linux's /proc.

Read by the parent for each sender and receiver, so the clients' own cost is on every status
row: a client pinned at 100 % CPU is the bottleneck, not the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

__all__ = ["TICKS_PER_S", "ProcSample", "parse_stat_ticks", "parse_statm_rss_pages", "sample"]

TICKS_PER_S: Final[int] = os.sysconf("SC_CLK_TCK")  # the unit of utime/stime in /proc/PID/stat
PAGE_SIZE: Final[int] = os.sysconf("SC_PAGE_SIZE")  # the unit of /proc/PID/statm
UTIME_FIELD: Final[int] = 14  # proc(5)'s numbering of /proc/PID/stat, counted from 1
STIME_FIELD: Final[int] = 15
STATE_FIELD: Final[int] = 3  # the first field after the command name


@dataclass(frozen=True, slots=True)
class ProcSample:
    """CPU time used so far (user + system, in clock ticks) and resident set size in bytes."""

    cpu_ticks: int
    rss_bytes: int


def parse_stat_ticks(stat: str) -> int:
    """User plus system clock ticks from a /proc/PID/stat line.

    The command name may hold spaces and parentheses, so fields are counted after its last ``)``.
    """
    fields = stat[stat.rindex(")") + 1 :].split()
    return int(fields[UTIME_FIELD - STATE_FIELD]) + int(fields[STIME_FIELD - STATE_FIELD])


def parse_statm_rss_pages(statm: str) -> int:
    """Resident pages: the second number of /proc/PID/statm."""
    return int(statm.split()[1])


def sample(pid: int) -> ProcSample | None:
    """Read one process's counters; ``None`` once it has exited (or on a system without /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/statm") as statm:
            return ProcSample(
                cpu_ticks=parse_stat_ticks(stat.read()),
                rss_bytes=parse_statm_rss_pages(statm.read()) * PAGE_SIZE,
            )
    except (OSError, ValueError):
        return None
