"""Credit in frames that a session holds toward its connection's writer (RabbitMQ ``credit_flow``).

A session spends one credit per TRANSFER frame it hands over and is blocked at zero; the writer
gives credit back in bumps of ``more_credit_after`` once that many frames have been written to the
socket. With the defaults at most 400 frames per session sit between session and socket.
"""

from __future__ import annotations

from typing import Final

# RabbitMQ's credit_flow_default_credit {InitialCredit=400, MoreCreditAfter=200}.
DEFAULT_INITIAL_CREDIT: Final = 400
DEFAULT_MORE_CREDIT_AFTER: Final = 200


class SessionCredit:
    """One session's credit toward the writer."""

    __slots__ = ("acked", "credit", "more_credit_after")

    def __init__(
        self,
        initial: int = DEFAULT_INITIAL_CREDIT,
        more_credit_after: int = DEFAULT_MORE_CREDIT_AFTER,
    ) -> None:
        if initial <= 0 or not 0 < more_credit_after <= initial:
            raise ValueError("writer credit needs 0 < more_credit_after <= initial")
        self.credit = initial
        self.more_credit_after = more_credit_after
        self.acked = 0

    @property
    def blocked(self) -> bool:
        """True while the session must not hand over another TRANSFER frame."""
        return self.credit <= 0

    def ack(self, frames: int) -> bool:
        """Count frames written; return True if this bump unblocked the session."""
        self.acked += frames
        if self.acked < self.more_credit_after:
            return False
        was_blocked = self.credit <= 0
        bump = self.acked - self.acked % self.more_credit_after
        self.acked -= bump
        self.credit += bump
        return was_blocked and self.credit > 0
