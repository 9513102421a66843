"""Storage faults for durable-log tests, injected through the log writer's fault hook."""

from __future__ import annotations

import errno
import threading


class FailingDisk:
    """A storage fault: ENOSPC on every write attempt while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = threading.Event()
        self.refused = 0

    def __call__(self, size: int) -> None:
        if self.failing.is_set():
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
