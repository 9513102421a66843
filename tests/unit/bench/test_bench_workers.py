"""The workers scenario's queues land one per worker, and its CPU count covers every process of
the server (the supervisor and the workers it forked)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.scenarios.workers import queue_names, tree_ticks
from sluicegate.clients.quiver import procstat
from sluicegate.queues.queue_homes import proposed_home


def test_as_many_queues_as_workers_put_one_on_each() -> None:
    for workers, queues in ((1, 4), (2, 2), (2, 4), (4, 4)):
        names = queue_names(workers, queues)
        assert len(set(names)) == queues
        homes = [proposed_home("/", name, workers) for name in names]
        assert homes == [index % workers for index in range(queues)]


def test_the_cpu_of_a_process_tree_counts_its_children() -> None:
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", f"{spin}\nimport time; time.sleep(5)"])
    try:
        while (
            procstat.sample(child.pid) is None or tree_ticks(child.pid) < 0.2 * procstat.TICKS_PER_S
        ):
            pass
        # This process's tree holds the child: its ticks are in the sum.
        assert tree_ticks(os.getpid()) >= tree_ticks(child.pid)
    finally:
        child.kill()
        child.wait()
