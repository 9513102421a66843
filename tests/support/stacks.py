"""A running Python process's stacks, read from outside with ``py-spy``: where a hung tool
(tests/integration/process_tree.py) or a stalled server (the adversary's prober,
support/adversary/watch.py) is, taken before it moves on or is killed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["python_stacks"]


def python_stacks(pid: int, timeout: float, nonblocking: bool = False) -> str:
    """``pid``'s Python stacks, or why there are none; ``nonblocking`` reads them without
    pausing the process (a server being watched goes on as it would)."""
    # The one installed with the test dependencies first: a venv need not be on PATH.
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return "(py-spy is not installed: no stacks)"
    command = [spy, "dump", "--pid", str(pid), *(["--nonblocking"] if nonblocking else [])]
    try:
        dump = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "(py-spy did not answer)"
    return dump.stdout + dump.stderr
