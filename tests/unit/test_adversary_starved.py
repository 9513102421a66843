"""The adversary's measure of a starved prober (tests/support/adversary/starved.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from support.adversary.starved import family, process_cpu_seconds, runqueue_wait, unexplained
from support.resident import resident


def test_only_the_largest_run_queue_wait_excuses_a_late_round() -> None:
    """Two processes may have waited at the same time: a 3 s round with waits of 2.5 s and
    0.5 s is still 0.5 s late, never excused by their sum."""
    assert unexplained(3.0, 2.5, 0.5) == 0.5
    assert unexplained(3.0) == 3.0


def test_run_queue_waits_are_read_for_every_thread_and_gone_processes_wait_nothing() -> None:
    assert runqueue_wait(os.getpid()) >= 0.0
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert runqueue_wait(int(ended.stdout)) == 0.0


def test_a_servers_family_is_its_process_and_its_workers() -> None:
    """A ``--workers N`` server is a supervisor and its children: their RSS, CPU and waits
    count, and a process gone counts as one without children."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        members = family(os.getpid())
        assert members[0] == os.getpid()
        assert child.pid in members
        assert process_cpu_seconds(os.getpid()) >= process_cpu_seconds(child.pid)
    finally:
        child.kill()
        child.wait()
    assert family(child.pid) == [child.pid]


def test_a_zombie_or_a_gone_process_holds_no_resident_set() -> None:
    """A worker that ended is a zombie until its supervisor reaps it: it has no VmRSS, and the
    family's RSS counts it as nothing rather than failing (seed 65852's run)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    assert resident(child.pid) is not None
    child.kill()
    for _ in range(1_000):
        with open(f"/proc/{child.pid}/stat") as stat:
            if stat.read().rpartition(")")[2].split()[0] == "Z":
                break
        time.sleep(0.005)
    assert resident(child.pid) is None
    child.wait()
    assert resident(child.pid) is None
