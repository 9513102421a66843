"""The connection writer's ledger: which frames are still between the sessions and the socket.

Every TRANSFER handed to proton is recorded with the running total of payload bytes handed; as
the IO layer reports bytes really written, the records those bytes cover are acknowledged to
their session's credit. Written bytes also carry frame headers and control frames, so they run a
little ahead of payload bytes (acknowledging early by at most the framing overhead); the written
total is capped at the handed total so that they never pre-pay transfers not yet handed over.
When the transport's output is empty the IO layer reports what proton still holds unsent, and
the ledger catches up exactly (:meth:`Writer.caught_up`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sluicegate.writer.credit import (
    DEFAULT_INITIAL_CREDIT,
    DEFAULT_MORE_CREDIT_AFTER,
    SessionCredit,
)


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """What the writer holds for metrics and tests."""

    frames_pending: int
    bytes_pending: int
    bytes_written: int
    sessions_blocked: int


class Writer:
    """Frames and bytes handed to the transport versus written to the socket, per connection."""

    def __init__(
        self,
        initial_credit: int = DEFAULT_INITIAL_CREDIT,
        more_credit_after: int = DEFAULT_MORE_CREDIT_AFTER,
    ) -> None:
        self._initial_credit = initial_credit
        self._more_credit_after = more_credit_after
        self._ledger: deque[tuple[int, SessionCredit, int]] = deque()
        self._handed = 0
        self._written = 0
        self._frames_pending = 0
        self._sessions: list[SessionCredit] = []

    def session_credit(self) -> SessionCredit:
        """Open a credit account for a new session of this connection."""
        credit = SessionCredit(self._initial_credit, self._more_credit_after)
        self._sessions.append(credit)
        return credit

    def forget(self, credit: SessionCredit) -> None:
        """Close a session's account (RabbitMQ ``peer_down``); its ledger entries still drain."""
        self._sessions.remove(credit)

    def handed(self, credit: SessionCredit, frames: int, nbytes: int) -> None:
        """Record a TRANSFER of ``frames`` frames and ``nbytes`` bytes handed to the transport."""
        credit.spend(frames)
        self._handed += nbytes
        self._frames_pending += frames
        self._ledger.append((self._handed, credit, frames))

    def written(self, nbytes: int) -> list[SessionCredit]:
        """Record bytes written to the socket; return the sessions this unblocked."""
        self._written = min(self._written + nbytes, self._handed)
        ledger = self._ledger
        unblocked: list[SessionCredit] = []
        while ledger and ledger[0][0] <= self._written:
            _, credit, frames = ledger.popleft()
            self._frames_pending -= frames
            if credit.ack(frames):
                unblocked.append(credit)
        return unblocked

    def caught_up(self, held: int) -> list[SessionCredit]:
        """The transport wrote all it had; only ``held`` bytes wait unsent inside proton."""
        # Even with nothing behind, transfers of no payload bytes handed since are now out.
        return self.written(max(0, self._handed - held - self._written))

    @property
    def bytes_pending(self) -> int:
        """Bytes of transfers handed over but not yet written."""
        return self._handed - self._written

    def statistics(self) -> WriterStatistics:
        """A snapshot for metrics and tests."""
        return WriterStatistics(
            frames_pending=self._frames_pending,
            bytes_pending=self.bytes_pending,
            bytes_written=self._written,
            sessions_blocked=sum(1 for s in self._sessions if s.blocked),
        )
