"""Lines a client can provoke at will, logged at most a few times per interval.

A flood of refused clients (no descriptors left, too many logins waiting, too many sockets
still logging in, refused logins, undecodable frames, clients timed out) would otherwise write
a log line per attempt: megabytes per second, a reactor busy writing them, and a disk a client
fills at its own pace (docs/bounds.md). Each kind logs its first ``burst`` occurrences in an
interval of :data:`LOG_INTERVAL` as they come, then counts the rest, and says how many it did
not log on its next line.
"""

from __future__ import annotations

import logging
from typing import Final

log = logging.getLogger("sluicegate")

# Seconds between two bursts of one kind of line.
LOG_INTERVAL: Final = 10.0
# Lines of one kind a client's doing may write per interval: every refused login of a normal
# day is logged, a loop of them writes at most 2 lines a second.
CLIENT_BURST: Final = 20


class RareWarning:
    """One kind of line, logged at most ``burst`` times per :data:`LOG_INTERVAL`."""

    __slots__ = ("_burst", "_due", "_left", "_level", "_log", "_message", "_since")

    def __init__(
        self,
        message: str,
        *,
        burst: int = 1,
        level: int = logging.WARNING,
        logger: logging.Logger = log,
    ) -> None:
        self._message = message
        self._log = logger
        self._burst = burst
        self._level = level
        self._due = 0.0
        self._left = 0
        self._since = 0

    def happened(self, now: float, detail: str) -> None:
        """Count one occurrence at ``now`` (seconds); log it if this interval has room."""
        self._since += 1
        if now >= self._due:
            self._due = now + LOG_INTERVAL
            self._left = self._burst
        if not self._left:
            return
        self._left -= 1
        if self._since > 1:
            self._log.log(
                self._level,
                "%s: %s (%d times since the last such line)",
                self._message,
                detail,
                self._since,
            )
        else:
            self._log.log(self._level, "%s: %s", self._message, detail)
        self._since = 0
