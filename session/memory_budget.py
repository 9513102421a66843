"""The server-wide budget for bytes held in memory on clients' behalf (RabbitMQ's memory alarm).

``used`` counts the message bytes the queues hold, the bytes handed to the transport and not yet
written, the metadata of unsettled outgoing deliveries, and the bytes of deliveries still
arriving; between two flushes it also counts the bytes read from publishing connections
(``reading``), so that what one pass of the reactor reads is charged before it is processed.

At or above ``limit`` the server is *blocked* until the bytes are back at ``resume_at`` (80 % by
default), so that it does not flap around the limit one message at a time. While blocked, the
publishers that hold the budget wait and the others may go on up to ``ceiling``, the limit plus
a margin; at the ceiling every publisher waits (session/inbound_flow.py says who waits when).

The margin is the one place where bytes above the limit come from, and it is handed out here,
in parts that add up to it, so that what grows into it by different paths cannot add up past
the ceiling (issue 31's seeds 65400 and 65501, docs/bounds.md):

- ``letters``: other workers' dead letters parked here while blocked, within the windows their
  senders keep (gateway/peers.py); they arrive unasked once sent, so their part is kept free;
- up to ``publishing_ceiling`` (the ceiling less that part): publishers not holding the budget,
  and, up to ``half_way`` only, what no hold weighs: requests for another worker's deliveries
  (session/waiting.py) and the delivery that has been arriving the longest
  (session/inbound_flow.py), so that what those bring once stopped lands in the other half
  and neither can take the publishers to the point where every one of them waits. What the
  requests out may still bring is reserved in ``used`` before it comes (session/waiting.py),
  each request within :meth:`import_room`, so that other workers' deliveries on credit
  granted, however many links hold some, add nothing when they arrive; a pre-settled remote
  consumer's recent deliveries kept on the owner (``Owner.recent_bytes``) are in ``used``
  too, and so leave that much less room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# The default: enough for a busy development server, far below a small machine's RAM.
DEFAULT_MEMORY_BUDGET: Final = 512 * 1024 * 1024
# RabbitMQ clears its memory alarm only well below the watermark; 80 % leaves room to refill
# consumers' credit without re-blocking at once.
DEFAULT_RESUME_RATIO: Final = 0.8
# The margin above the limit for publishers that do not hold the budget: an eighth of it, at
# most 16 MiB, so that the server's overshoot stays a small fixed slack (docs/operations.md).
CEILING_SHARE: Final = 8
MAX_CEILING_MARGIN: Final = 16 * 1024 * 1024
# The part of the margin kept for other workers' dead letters parked while blocked: a quarter.
# Letters are the fan-out of consumers' outcomes, never urgent; a window of a quarter of the
# margin over the peers still lets a 64 MiB budget on two workers take 1 MiB of them per round
# trip between two workers.
LETTERS_SHARE: Final = 4


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """The budget's state for metrics and tests."""

    used: int
    limit: int
    resume_at: int
    blocked: bool
    blocks: int
    unfinished: int = 0
    ceiling: int = 0


class MemoryBudget:
    """Bytes held for clients, against the server's limit."""

    __slots__ = (
        "blocked",
        "blocks",
        "ceiling",
        "letters",
        "limit",
        "peak",
        "reading",
        "resume_at",
        "unfinished",
        "used",
    )

    def __init__(
        self, limit: int = DEFAULT_MEMORY_BUDGET, resume_ratio: float = DEFAULT_RESUME_RATIO
    ) -> None:
        if limit <= 0:
            raise ValueError(f"memory budget must be positive, got {limit}")
        if not 0.0 < resume_ratio < 1.0:
            raise ValueError(f"resume ratio must be between 0 and 1, got {resume_ratio}")
        self.limit = limit
        self.resume_at = int(limit * resume_ratio)
        self.ceiling = limit + min(limit // CEILING_SHARE, MAX_CEILING_MARGIN)
        self.used = 0
        # The most ``used`` has been: what tests hold against the ceiling, in bytes, whenever
        # it was reached (docs/bounds.md).
        self.peak = 0
        # Bytes read from publishing connections since the last update.
        self.reading = 0
        # Bytes of deliveries still arriving, on every connection (part of ``used``).
        self.unfinished = 0
        self.blocked = False
        self.blocks = 0
        # The margin's part kept for other workers' letters (:meth:`keep_for_letters`).
        self.letters = 0

    @property
    def margin(self) -> int:
        """The bytes above the limit, all of them handed out by the parts above."""
        return self.ceiling - self.limit

    @property
    def publishing_ceiling(self) -> int:
        """Where every publisher waits: the ceiling less the part kept for letters."""
        return self.ceiling - self.letters

    @property
    def half_way(self) -> int:
        """Where what no hold weighs stops taking (imports, the oldest arriving delivery):
        half way from the limit to :attr:`publishing_ceiling`."""
        return self.limit + (self.publishing_ceiling - self.limit) // 2

    def room(self, used: int) -> int:
        """What may still be stored unasked with ``used`` bytes held (dead letters: their
        copies, and the death records that make their payload new bytes): up to the limit,
        blocked or not, so that nothing stored so takes the margin the publishers not holding
        the budget go on in, nor the count past the ceiling; and so that, as consumers drain
        below the limit, letters to one queue go on moving while blocked (waiting for the
        budget to resume, those whose source queue nobody drains could wait for good)."""
        return max(0, self.limit - used)

    def import_room(self, reserved: int) -> int:
        """The most other workers' deliveries may have reserved (``reserved`` of ``used`` now,
        session/waiting.py) until the next update: what is left to :attr:`half_way` once
        everything else counted is taken. Over it, what was granted beyond is taken back."""
        return self.half_way - self.used + reserved

    def keep_for_letters(self, peers: int) -> int:
        """Keep the letters' part of the margin for ``peers`` other workers (none: nothing is
        kept), and return the window of this worker's own letters to each of them: every
        worker has the same share of the budget, so each peer keeps as much for this one's."""
        if not peers:
            self.letters = 0
            return 0
        self.letters = self.margin // LETTERS_SHARE
        return self.letters // peers

    @property
    def current(self) -> int:
        """The bytes held now, counting what was read since the last update."""
        return self.used + self.reading

    def block(self) -> None:
        """Block at once: a read between two updates reached the limit."""
        self.blocked = True
        self.blocks += 1

    def update(self, used: int) -> bool:
        """Take the bytes now held; True if that blocked or unblocked the server."""
        self.used = used
        self.peak = max(self.peak, used)
        self.reading = 0
        if self.blocked:
            if used <= self.resume_at:
                self.blocked = False
                return True
        elif used >= self.limit:
            self.block()
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
            unfinished=self.unfinished,
            ceiling=self.ceiling,
        )
