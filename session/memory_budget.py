"""The server-wide budget for bytes held in memory on clients' behalf (RabbitMQ's memory alarm).

``used`` counts the message bytes the queues hold, the bytes handed to the transport and not yet
written, the metadata of unsettled outgoing deliveries, and the bytes of deliveries still
arriving; between two flushes it also counts the bytes read from publishing connections
(``reading``), so that what one pass of the reactor reads is charged before it is processed.

At or above ``limit`` the server is *blocked* until the bytes are back at ``resume_at`` (80 % by
default), so that it does not flap around the limit one message at a time. While blocked, the
publishers that hold the budget wait and the others may go on up to ``ceiling``, the limit plus
a margin; at the ceiling every publisher waits (session/inbound_flow.py says who waits when).

The margin is the one place where bytes above the limit come from, and it is handed out here
in parts, each class of bytes that grows into it by its own path weighed by what it holds
against its own part only, so that none can take another's and all of them together cannot pass
the ceiling (issue 31's seeds 65400, 65501, 65701, 65702, 65800 and 65802, docs/bounds.md):

- ``letters`` (a quarter): this worker's dead letters sent to other workers and not yet
  confirmed (``letters_sent``, gateway/peers.py), within the windows their owners keep, and
  its publishes sent to them and not yet confirmed, within the window each owner keeps parked
  (``parked_sent``): an owner blocked for good confirms neither, and weighed on the
  publishers' part they kept a worker past its publishers' ceiling, every publisher waiting
  (adversary seed 71000, its 995 KB parked on the other worker 10 KB past it);
- ``imports_part`` (an eighth): other workers' deliveries (``imported``: reserved on the credit
  granted and waiting in sessions, session/waiting.py), so that a consumer of another worker's
  queue is served while this worker is blocked by other clients' bytes;
- ``unfinished_part`` (an eighth): deliveries still arriving (``unfinished``,
  session/inbound_flow.py); at it the oldest arriving delivery is held like the others, and
  past it the newest are released;
- the rest (half, or seven eighths alone), up to ``publishing_ceiling``: publishers not
  holding the budget, weighed by the ``publishing_level``, every byte counted less what the
  three classes hold within their parts.

The first two exist only with other workers. A class's bytes beyond its part (grown below the
limit, before the budget blocked), and bytes that move out of one (a delivery that ends into a
queue), weigh on the publishers' part, and :meth:`room_for` a class is its part less what it
holds, less what the publishers' level is past theirs, so the ceiling holds whatever the order.
Bytes that grow with no class's gate, writers of consumers that do not read, are kept small
while blocked instead (writer/writer.py's ``BLOCKED_MAX_BYTES``). A publisher whose messages
go straight to a waiting consumer still needs the publishers' part: its bytes land in that
consumer's writer, bounded per connection, not server-wide. What the requests out for imports
may still bring is reserved in ``used`` before it comes (session/waiting.py), each request
within :meth:`import_room`.
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
# The part of the margin kept for this worker's dead letters on their way to other workers: a
# quarter. Letters are the fan-out of consumers' outcomes, never urgent; a window of a quarter of
# the margin over the peers still lets a 64 MiB budget on two workers take 1 MiB of them per
# round trip between two workers.
LETTERS_SHARE: Final = 4
# The part kept for other workers' deliveries: an eighth, two of the largest import requests
# (session/waiting.py's IMPORT_BATCH, 256 KiB) for a 64 MiB budget on two workers, and hundreds
# of a prober's small messages, so that the publishers keep half the margin.
IMPORTS_SHARE: Final = 8
# The part kept for deliveries still arriving: an eighth. They are bytes no consumer can drain,
# the least urgent of all; a part of their own lets the oldest go on a little while blocked.
UNFINISHED_SHARE: Final = 8


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
    # What the margin's classes hold (session/memory_budget.py) and where publishers wait.
    imported: int = 0
    letters_sent: int = 0
    # The most bytes of letters this worker had sent to one other worker and not confirmed:
    # within the window, but for a copy larger than it, alone (gateway/peers.py).
    letters_window_peak: int = 0
    publishing_level: int = 0
    publishing_ceiling: int = 0


class MemoryBudget:
    """Bytes held for clients, against the server's limit."""

    __slots__ = (
        "blocked",
        "blocks",
        "ceiling",
        "imported",
        "imports_part",
        "letters",
        "letters_sent",
        "letters_window_peak",
        "limit",
        "parked_sent",
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
        # The margin's parts kept for this worker's letters to other workers and for other
        # workers' deliveries (:meth:`keep_for_letters`), and what those two hold, as the
        # gateway found them at its last flush.
        self.letters = 0
        self.imports_part = 0
        self.letters_sent = 0
        self.letters_window_peak = 0
        self.parked_sent = 0
        self.imported = 0

    @property
    def margin(self) -> int:
        """The bytes above the limit, all of them handed out by the parts above."""
        return self.ceiling - self.limit

    @property
    def unfinished_part(self) -> int:
        """The margin's part for deliveries still arriving."""
        return self.margin // UNFINISHED_SHARE

    @property
    def publishing_ceiling(self) -> int:
        """Where every publisher waits: the limit and the margin less the other classes' parts."""
        return self.ceiling - self.letters - self.imports_part - self.unfinished_part

    def publishing_level(self, current: int) -> int:
        """``current`` bytes held less what each other class holds within its part: what the
        publishers' part is weighed by, so that no other class takes it."""
        return (
            current
            - min(self.unfinished, self.unfinished_part)
            - min(self.imported, self.imports_part)
            - min(self.letters_sent + self.parked_sent, self.letters)
        )

    def publishers_full(self, current: int) -> bool:
        """Whether the blocked budget's publishers' part is taken: every publisher waits."""
        return self.publishing_level(current) >= self.publishing_ceiling

    def room_for(self, held: int, part: int) -> int:
        """What a class of the margin holding ``held`` bytes of its ``part`` may still take while
        blocked: the rest of its part, less what the publishers' level is past their ceiling
        (bytes grown below the limit beyond a class's part, or moved out of one, are counted
        there), so that the ceiling holds whatever the others do."""
        over = self.publishing_level(self.used) - self.publishing_ceiling
        return part - held - max(0, over)

    def unfinished_room(self) -> int:
        """What deliveries still arriving may still take while blocked (session/inbound_flow.py)."""
        return self.room_for(self.unfinished, self.unfinished_part)

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
        session/waiting.py) until the next update: below the limit, what is left to it and the
        imports' part; blocked, what :meth:`room_for` leaves in their part. Over it, what was
        granted beyond is taken back."""
        room = self.room_for(self.imported, self.imports_part)
        if not self.blocked:
            # ``used`` counts what the imports hold already.
            room = max(room, self.limit + self.imports_part - self.used)
        return reserved + room

    def keep_for_letters(self, peers: int) -> int:
        """Keep the letters' and the imports' parts of the margin for ``peers`` other workers
        (none: nothing is kept), and return the window of this worker's own letters to each of
        them, its letters' part split among them."""
        if not peers:
            self.letters = self.imports_part = 0
            return 0
        self.letters = self.margin // LETTERS_SHARE
        self.imports_part = self.margin // IMPORTS_SHARE
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
            imported=self.imported,
            letters_sent=self.letters_sent,
            letters_window_peak=self.letters_window_peak,
            publishing_level=self.publishing_level(self.used),
            publishing_ceiling=self.publishing_ceiling,
        )
