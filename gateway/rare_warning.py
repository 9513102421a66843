"""Warnings a client can provoke at will, logged at most once per interval.

A flood of refused clients (no descriptors left, too many logins waiting, too many sockets
still logging in) would otherwise write a log line per attempt: megabytes per second, and a
reactor busy writing them. Each kind is logged once per :data:`LOG_INTERVAL` with how many times
it happened since the last line.
"""

from __future__ import annotations

import logging
from typing import Final

log = logging.getLogger("sluicegate")

# Seconds between two lines of one kind of warning.
LOG_INTERVAL: Final = 10.0


class RareWarning:
    """One kind of warning, logged at most once per :data:`LOG_INTERVAL`."""

    __slots__ = ("_due", "_message", "_since")

    def __init__(self, message: str) -> None:
        self._message = message
        self._due = 0.0
        self._since = 0

    def happened(self, now: float, detail: str) -> None:
        """Count one occurrence at ``now`` (seconds); log if the interval has passed."""
        self._since += 1
        if now < self._due:
            return
        log.warning(
            "%s: %s (%d times since the last such line)", self._message, detail, self._since
        )
        self._since = 0
        self._due = now + LOG_INTERVAL
