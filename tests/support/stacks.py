"""A running Python process's stacks, read from outside with ``py-spy``: where a hung tool
(tests/integration/process_tree.py) or a stalled server (the adversary's prober,
support/adversary/watch.py) is, taken before it moves on or is killed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["python_stacks"]


def python_stacks(pid: int, timeout: float) -> str:
    """``pid``'s Python stacks, or why there are none (py-spy pauses it while it reads them:
    read without pausing, a busy process's threads showed no frames)."""
    # The one installed with the test dependencies first: a venv need not be on PATH.
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return "(py-spy is not installed: no stacks)"
    try:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "(py-spy did not answer)"
    return dump.stdout + dump.stderr
