"""The workers scenario's queues land one per worker, its CPU count covers every process of the
server (the supervisor and the workers it forked), and it tells how many clients their queue's
worker serves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.pinned_cost import _accepted_by, workers_by_index
from bench.scenarios.workers import clients_on_owner, queue_names, tree_ticks
from bench.servers import start_sluicegate, stop
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


@pytest.mark.slow
def test_the_clients_on_their_queues_worker_are_told_by_which_worker_accepted_them(
    tmp_path: Path,
) -> None:
    server = start_sluicegate("sluicegate", ["--workers", "2"], tmp_path / "data")
    try:
        pids = workers_by_index(server, 2)
        name = queue_names(2, 1)[0]  # on worker 0
        # A stand-in for a quiver: a process holding four connections to the server.
        with subprocess.Popen(
            [sys.executable, "-c", _HOLDER, server.host, str(server.port)],
            stdout=subprocess.PIPE,
            text=True,
        ) as holder:
            try:
                assert holder.stdout is not None
                ports = [int(port) for port in holder.stdout.readline().split()]
                on_zero = 0
                for port in ports:
                    while (worker := _accepted_by(server.port, port, pids)) is None:
                        time.sleep(0.01)
                    on_zero += worker == pids[0]
                assert server.pid is not None
                found = clients_on_owner(server.pid, server.port, {name: holder.pid}, 2)
                assert found == (on_zero, 4)
            finally:
                holder.kill()
    finally:
        stop(server)


_HOLDER = """
import socket, sys, time
held = [socket.create_connection((sys.argv[1], int(sys.argv[2]))) for _ in range(4)]
print(" ".join(str(sock.getsockname()[1]) for sock in held), flush=True)
time.sleep(60)
"""
