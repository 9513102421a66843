"""Run a command line tool as a user would, and when it hangs, say where.

A tool that hangs inside a test leaves pytest-timeout only the test process's own stacks: the
tool's processes (its server, its client processes) are where it is stuck, and their state is
gone once they are killed. So the tool runs in a session of its own; at its deadline every
process of that session has its Python stacks dumped with ``py-spy`` before the session is
killed, and the test fails with the dumps and the tool's output so far.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pytest
from support.stacks import python_stacks

__all__ = ["run_or_explain"]

DUMP_TIMEOUT_S: Final = 20.0
# What of the tool's output goes into the failure: its last lines say which phase it reached.
OUTPUT_TAIL: Final = 4000


def _session_pids(session: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == session:
                pids.append(int(entry.name))
        except OSError:
            continue  # it ended meanwhile
    return sorted(pids)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def run_or_explain(
    command: Sequence[str], timeout: float, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command)`` with output captured; a hang fails the test with stacks."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
    hung = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        dumps = [
            f"--- pid {pid}: {_command_line(pid)}\n{python_stacks(pid, DUMP_TIMEOUT_S)}"
            for pid in _session_pids(process.pid)
        ]
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        _kill_leftovers(process.pid)
    if hung:
        pytest.fail(
            f"{' '.join(command)} hung for {timeout:g} s\n"
            f"stderr (tail):\n{stderr[-OUTPUT_TAIL:]}\nstdout (tail):\n{stdout[-OUTPUT_TAIL:]}\n"
            + "\n".join(dumps),
            pytrace=False,
        )
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _kill_leftovers(session: int) -> None:
    """Processes the tool left behind (a client process it failed to stop) end with it."""
    for pid in _session_pids(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
