"""The server-wide budget for message bytes held in memory (DESIGN §1, RabbitMQ's memory alarm).

Above ``limit`` the server is *blocked*: publishers get no new link credit and no session takes
new transfers, while consumers keep consuming, which is what brings the bytes down. Publishing
resumes once the bytes held are at or below ``resume_at`` (80 % by default), so the server does
not flap around the limit one message at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# The default: enough for a busy development server, far below a small machine's RAM.
DEFAULT_MEMORY_BUDGET: Final = 512 * 1024 * 1024
# RabbitMQ clears its memory alarm only well below the watermark; 80 % leaves room to refill
# consumers' credit without re-blocking at once.
DEFAULT_RESUME_RATIO: Final = 0.8


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """The budget's state for metrics and tests."""

    used: int
    limit: int
    resume_at: int
    blocked: bool
    blocks: int


class MemoryBudget:
    """Bytes of message bodies held, against the server's limit."""

    __slots__ = ("blocked", "blocks", "limit", "resume_at", "used")

    def __init__(
        self, limit: int = DEFAULT_MEMORY_BUDGET, resume_ratio: float = DEFAULT_RESUME_RATIO
    ) -> None:
        if limit <= 0:
            raise ValueError(f"memory budget must be positive, got {limit}")
        if not 0.0 < resume_ratio < 1.0:
            raise ValueError(f"resume ratio must be between 0 and 1, got {resume_ratio}")
        self.limit = limit
        self.resume_at = int(limit * resume_ratio)
        self.used = 0
        self.blocked = False
        self.blocks = 0

    def update(self, used: int) -> bool:
        """Take the bytes now held; True if that blocked or unblocked the server."""
        self.used = used
        if self.blocked:
            if used <= self.resume_at:
                self.blocked = False
                return True
        elif used >= self.limit:
            self.blocked = True
            self.blocks += 1
            return True
        return False

    def statistics(self) -> BudgetStatistics:
        """Counts for metrics and tests."""
        return BudgetStatistics(
            used=self.used,
            limit=self.limit,
            resume_at=self.resume_at,
            blocked=self.blocked,
            blocks=self.blocks,
        )
