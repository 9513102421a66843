"""A worker process that ends with its supervisor (Linux's ``prctl(PR_SET_PDEATHSIG)``).

A worker left serving after its supervisor died would hold the shared port with nobody to
restart it or to stop it on SIGTERM (docs/workers.md). It is a C call, so it lives beside the
other C calls in the quarantine (docs/design.md), where ruff's ban on ``ctypes`` allows it.
"""

from __future__ import annotations

import ctypes
import signal
from typing import Final

# prctl's option number for "signal me when my parent dies" (linux/prctl.h).
_PR_SET_PDEATHSIG: Final = 1


def end_with_parent(signum: signal.Signals = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
