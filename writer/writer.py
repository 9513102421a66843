"""Pure accounting of the connection writer: frames and bytes handed to the transport versus
bytes written.

RabbitMQ's ``credit_flow`` between writer and session, measured on bytes that really reached the
socket, because proton's own output buffer is unbounded and invisible (docs/design.md). Frame
credit keeps the sessions of a connection fair to each other; the bound on memory is in bytes:
a client announces its own max-frame-size (up to 4 GiB), so a count of frames bounds nothing.
Once ``max_bytes`` are handed and unwritten the writer is *full* and every session waits until
half of them are written.

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
from typing import Final

from sluicegate.writer.credit import (
    DEFAULT_INITIAL_CREDIT,
    DEFAULT_MORE_CREDIT_AFTER,
    SessionCredit,
)

# Bytes handed and not yet written, per connection, before the writer is full.
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
# The same while the memory budget is blocked (``ServerBytes.cap``): a client that reads keeps
# its socket busy with 64 KiB, one that does not stops there rather than at 4 MiB, so that
# consumers who do not read cannot take the margin publishers go on in (issue 31's seed 65702:
# 3.4 MB in such writers held every publisher of a worker past its publishers' ceiling).
BLOCKED_MAX_BYTES: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """What the writer holds for metrics and tests."""

    frames_pending: int
    bytes_pending: int
    bytes_written: int
    sessions_blocked: int
    full: bool = False


class ServerBytes:
    """A byte count over every connection, which the server's memory budget reads: the bytes
    writers handed and have not yet written, or the deliveries waiting in sessions
    (session/waiting.py)."""

    __slots__ = ("cap", "total")

    def __init__(self) -> None:
        self.total = 0
        # While set (the memory budget is blocked), each writer's ``max_bytes`` is at most it.
        self.cap = 0


class Writer:
    """Frames and bytes handed to the transport versus written to the socket, per connection."""

    def __init__(
        self,
        initial_credit: int = DEFAULT_INITIAL_CREDIT,
        more_credit_after: int = DEFAULT_MORE_CREDIT_AFTER,
        max_bytes: int = DEFAULT_MAX_BYTES,
        pending: ServerBytes | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self._initial_credit = initial_credit
        self._more_credit_after = more_credit_after
        self.max_bytes = max_bytes
        self._resume_bytes = max_bytes // 2
        # Shared with the server's other writers (the memory budget reads the total).
        self.pending = ServerBytes() if pending is None else pending
        # Handed bytes reached max_bytes: no session hands more until half are written.
        self.full = False
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

    @property
    def unwritten(self) -> int:
        """Bytes handed to the transport and not written yet."""
        return self._handed - self._written

    @property
    def limit(self) -> int:
        """What may be handed and unwritten now: ``max_bytes``, or the server's cap while set."""
        cap = self.pending.cap
        return min(cap, self.max_bytes) if cap else self.max_bytes

    @property
    def room(self) -> int:
        """Bytes a session may still hand over now (0 while the writer is full)."""
        if self.full:
            return 0
        return max(0, self.limit - (self._handed - self._written))

    def handed(self, credit: SessionCredit, frames: int, nbytes: int) -> int:
        """Record a TRANSFER of ``frames`` frames and ``nbytes`` bytes handed to the transport;
        return the :attr:`room` left, which only this changes while a session hands over."""
        credit.credit -= frames  # frames handed over: may overdraw by one message
        handed = self._handed = self._handed + nbytes
        self.pending.total += nbytes
        self._frames_pending += frames
        self._ledger.append((handed, credit, frames))
        room = self.limit - (handed - self._written)
        if room <= 0:
            self.full = True
            return 0
        return 0 if self.full else room

    def written(self, nbytes: int) -> list[SessionCredit]:
        """Record bytes written to the socket; return the sessions this unblocked."""
        before = self._written
        self._written = min(self._written + nbytes, self._handed)
        self.pending.total -= self._written - before
        ledger = self._ledger
        written = self._written
        unblocked: list[SessionCredit] = []
        while ledger and ledger[0][0] <= written:
            _, credit, frames = ledger.popleft()
            # The next transfers of the same session are acknowledged with these: one ack of
            # their sum leaves the credit as one ack each would (its remainder carries over).
            while ledger and ledger[0][1] is credit and ledger[0][0] <= written:
                frames += ledger.popleft()[2]
            self._frames_pending -= frames
            if credit.ack(frames):
                unblocked.append(credit)
        if self.full and self._handed - self._written <= min(self._resume_bytes, self.limit // 2):
            self.full = False
            return list(self._sessions)
        return unblocked

    def caught_up(self, held: int) -> list[SessionCredit]:
        """The transport wrote all it had; only ``held`` bytes wait unsent inside proton."""
        # Even with nothing behind, transfers of no payload bytes handed since are now out.
        return self.written(max(0, self._handed - held - self._written))

    def close(self) -> None:
        """The connection is gone: what it had handed no longer counts."""
        self.pending.total -= self._handed - self._written
        self._written = self._handed

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
            full=self.full,
        )
