"""Time a process spent runnable but not running: what a loaded machine, not the server, costs.

A prober round that overran its limit while the server used no CPU is either a held prober
(the server waits for something that never comes: a bug) or a starved one (the prober and the
server were ready to run and the machine gave them no CPU: 2 cores shared with other test runs
give a CPU-bound loop 44 % of its wall time, measured). Linux counts the second per thread in
``/proc/PID/task/TID/schedstat`` (its second field: nanoseconds waiting on a run queue), so the
run can tell them apart instead of shrinking a breach that no replay reproduces (issue 31's
seed 3007, docs/adversary.md).
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["family", "process_cpu_seconds", "runqueue_wait", "unexplained"]

NS: Final = 1e-9


def family(pid: int) -> list[int]:
    """``pid`` and its child processes: a server of ``--workers N`` is a supervisor and its N
    workers (docs/workers.md)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [pid, *(int(child) for child in children.read().split())]
    except OSError:
        return [pid]


def runqueue_wait(pid: int) -> float:
    """Seconds the threads of process ``pid`` or of one of its children (the most of any)
    have spent waiting for a CPU: the largest only, as in :func:`unexplained`."""
    return max(_runqueue_wait(member) for member in family(pid))


def _runqueue_wait(pid: int) -> float:
    """Seconds the threads of process ``pid`` have spent waiting for a CPU (0 if it is gone)."""
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total * NS


def process_cpu_seconds(pid: int) -> float:
    """CPU time process ``pid`` and its children have used (user + system), from
    /proc/PID/stat (0 for one gone): what tells a busy server from a held or a starved prober."""
    return sum(_cpu_seconds(member) for member in family(pid))


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return ticks / os.sysconf("SC_CLK_TCK")


def unexplained(waited: float, *runqueue_waits: float) -> float:
    """The part of a wait of ``waited`` seconds that no process's run-queue wait explains.

    Only the largest process's wait is taken off: the processes may have waited at the same
    time, and a breach must never be excused by more than the machine certainly took.
    """
    return waited - max(runqueue_waits, default=0.0)
