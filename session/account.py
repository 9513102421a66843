"""A connection's account: the work it caused that the server has not finished (Syndicate).

Every routed copy of a message a connection publishes borrows one unit, so a fan-out to ten
queues costs ten; the unit is repaid when that copy is stored (in memory, or fsynced for a
durable queue). While the debt is at or above ``limit`` the connection's socket is not read,
so the kernel's buffers fill and TCP closes the window on the client; reading resumes once the
debt is back at ``resume_at`` or below. The gap between the two marks avoids toggling per
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# RabbitMQ credit_flow's default {400, 200}: a process may have 400 messages in flight to
# another before it blocks, and is unblocked after 200 are processed.
DEFAULT_ACCOUNT_LIMIT: Final = 400


@dataclass(frozen=True, slots=True)
class AccountStatistics:
    """An account's state for metrics and tests."""

    debt: int
    paused: bool
    limit: int
    resume_at: int
    borrowed: int
    pauses: int


class Account:
    """Outstanding work charged to one connection, and whether its reads are paused."""

    __slots__ = ("__weakref__", "borrowed", "debt", "limit", "paused", "pauses", "resume_at")

    def __init__(self, limit: int = DEFAULT_ACCOUNT_LIMIT, resume_at: int | None = None) -> None:
        if limit <= 0:
            raise ValueError(f"account limit must be positive, got {limit}")
        resume = limit // 2 if resume_at is None else resume_at
        if not 0 <= resume < limit:
            raise ValueError(f"resume_at must be in [0, {limit}), got {resume}")
        self.limit = limit
        self.resume_at = resume
        self.debt = 0
        self.paused = False
        self.borrowed = 0
        self.pauses = 0

    def borrow(self, units: int) -> bool:
        """Charge ``units`` of work; True if reads must pause now."""
        self.debt += units
        self.borrowed += units
        if not self.paused and self.debt >= self.limit:
            self.paused = True
            self.pauses += 1
            return True
        return False

    def repay(self, units: int) -> bool:
        """Mark ``units`` of work done; True if reads may resume now."""
        if units > self.debt:
            raise ValueError(f"repaying {units} units of a debt of {self.debt}")
        self.debt -= units
        if self.paused and self.debt <= self.resume_at:
            self.paused = False
            return True
        return False

    def statistics(self) -> AccountStatistics:
        """Counts for metrics and tests."""
        return AccountStatistics(
            debt=self.debt,
            paused=self.paused,
            limit=self.limit,
            resume_at=self.resume_at,
            borrowed=self.borrowed,
            pauses=self.pauses,
        )
