"""What one connection's sessions hold for its consumers and have not sent: charged and capped.

A queue hands a session a batch of at most ``max_queue_credit`` deliveries per consumer link, and
they wait in ``outgoing_pending`` until the writer and the client's window let them go. A client
that opens 64 sessions of 256 links, grants credit on each and never reads would so make the
server hold 16,384 batches. Most are references to messages their queue holds, but a durable
stream's reader gets each batch's bodies read into messages of its own (up to 128 KiB a batch,
queues/log/stream_entries.py), and a pre-settled consumer of a durable classic queue gets each
message's body kept with it until it is sent: some 2 GiB for one connection.

So every delivery waiting in a session is charged to its connection (its bytes held in memory
plus :data:`WAITING_DELIVERY_COST`) and to the server's total, which the memory budget counts.
Once a connection's charge reaches its limit (``max_outgoing_pending_size``) its sessions stop
asking queues for credit: each request is deferred, in order, and made once the charge is back
at half the limit, so a connection holds at most its limit plus one batch of one link
(docs/outbound-flow-control.md). The reactor keeps serving everyone else meanwhile; the client
that stopped reading is the only one that waits.

That limit is no bound for a blocked budget: such bodies are bytes no queue counts, and a
consumer that never read pulled its limit into the count while the budget was blocked, past
the publishers' ceiling, where every publisher waited for it (docs/bounds.md). While blocked,
they are asked for as another worker's deliveries are (:class:`WaitingBytes`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.writer.writer import ServerBytes, Writer

# What a delivery waiting in a session costs beyond its message's bytes: its entry in
# outgoing_pending (a tuple and two deque slots) and a message object of its own (a durable
# stream's reader gets fresh ones), about 250 bytes measured with 4,096 readers' batches.
WAITING_DELIVERY_COST: Final = 256
# The bytes a request to a queue of another worker asks for at most, by the largest delivery its
# link was sent (the first asks for one): its deliveries come over the channel as bytes this
# worker did not hold, so what the requests out when the budget blocks can still bring is a
# quarter MiB a link, while a batch of 100-byte messages is still the whole 256.
IMPORT_BATCH: Final = 256 * 1024
# The owner sends no more than what was reserved (session/channel/frames.py ``Credit``) and
# holds back the rest, asking for more (``Short``): reserved at exactly the largest delivery
# seen, a message one byte longer cost a round trip between the workers. An eighth more lets
# sizes vary that much, and only a delivery larger than that waits for a reservation of its own;
# small ones vary by a few bytes (a counter in the body), less than an eighth of them.
SIZE_SLACK: Final = 8
MIN_SLACK: Final = 64
# Twice the writer's buffer (4 MiB): a connection over it has more ready than its writer may
# hand proton at once, so deferring its credit requests never leaves its socket idle.
DEFAULT_MAX_OUTGOING_PENDING: Final = 8 * 1024 * 1024
# No budget said otherwise yet (a session alone, before the gateway's first flush).
UNLIMITED_IMPORT_ROOM: Final = 1 << 62


def import_unit(link: OutgoingLink) -> int:
    """What one delivery of another worker's queue is reserved as: the link's largest so far
    and an eighth more, at least :data:`MIN_SLACK`, or, before it was sent any, a whole batch
    (its first request asks for one), with the cost of its place in the session, as it is
    charged when it arrives."""
    largest = link.largest
    if not largest:
        return IMPORT_BATCH + WAITING_DELIVERY_COST
    return largest + max(largest // SIZE_SLACK, MIN_SLACK) + WAITING_DELIVERY_COST


@dataclass(frozen=True, slots=True)
class WaitingStatistics:
    """A connection's waiting deliveries for metrics and tests."""

    bytes: int
    limit: int
    resume_at: int
    paused: bool
    pauses: int
    deferred: int


class WaitingBytes(ServerBytes):
    """What deliveries waiting in every connection's sessions hold, and the memory budget's
    state as the gateway's last flush found it.

    A local queue's deliveries are bytes its queue counts already; another worker's
    (``OutgoingLink.imports``) are new bytes here, and a client granting credit and never
    reading made a worker count them past its ceiling, where every publisher waits (issue 31's
    seed 65200, docs/workers.md). So, as publishers that do not hold the budget go on into its
    margin: while the budget is blocked a connection asks for such deliveries only while it
    holds less than ``IMPORT_BATCH`` unsent, in its sessions and its writer (a client that
    reads is still served, one that does not stops there), and once the part of the margin
    kept for imports is taken (``full``) only while it holds nothing unsent, so that what the
    requests already out bring lands within it. A
    request that may not go waits with the connection's deferred ones; ``starved`` names the
    connections that have some, for the gateway to make them once the budget lets go.

    What the requests out may still bring is a bound by construction, not a hope: every byte
    another worker may send on the credit granted (its link's ``reserved``: the credit its
    owner holds by the link's largest delivery) is counted here (``reserved``), in the memory
    budget as if it had arrived, and a request goes only within ``import_room``, what is left
    of the imports' own part of the margin (``imported``, with what waits in sessions,
    session/memory_budget.py), so that other clients' bytes cannot take it. A delivery that
    arrives turns reserved bytes into waiting ones, adding nothing; a reply gives back what
    its owner no longer holds; and credit granted beyond the room when the budget filled is
    taken back (``take_back`` in session/outbound.py). Without it each link kept what it was
    granted before the budget blocked, and N links brought N batches past the ceiling
    (docs/bounds.md).

    The part is shared, so what holds it is taken back when a connection waits for it
    (``reclaim`` in session/outbound.py): deliveries waiting on clients that read nothing go
    back to their queues, and credit reserved on empty queues is lent, its links asking
    again behind the connections that waited first (``starved`` keeps their order).

    A local queue's deliveries that no queue counts (``OutgoingLink.uncounted``: a stream's
    reader, a pre-settled consumer's stored messages, their bodies read for it) are new bytes
    in the count too, on the publishers' part: while the budget is blocked their requests go
    as an import's would (:meth:`Waiting.may_import`), sized by bytes, and wait, starved,
    otherwise; there is no reservation (their queue answers at once), so the credit such a
    queue holds when the budget blocks is taken back (``uncounted``, ``take_back_uncounted``
    in session/outbound.py). Without it, a client that never read pulled its connection's
    limit, 8 MiB, into a blocked budget (docs/bounds.md).
    """

    __slots__ = (
        "blocked",
        "check_stalls",
        "full",
        "given_back",
        "holding",
        "import_room",
        "imported",
        "reserved",
        "reserving",
        "room_full",
        "stalled",
        "starved",
        "uncounted",
    )

    def __init__(self) -> None:
        super().__init__()
        self.blocked = False
        self.full = False
        # In the order they began to wait: the room a flush finds goes to the oldest first.
        self.starved: dict[Waiting, None] = {}
        # Bytes other workers may still send on the credit granted, and the links that hold
        # some (what ``take_back`` walks): a dict, so that the oldest reservations go first.
        self.reserved = 0
        self.reserving: dict[OutgoingLink, None] = {}
        # Of ``total``, what other workers' deliveries waiting in sessions hold: with
        # ``reserved``, what the budget's imports' part holds (session/memory_budget.py).
        self.imported = 0
        # The most ``reserved`` may reach until the next flush sets it again (the gateway's,
        # from the budget); a connection starved for it sets ``room_full``.
        self.import_room = UNLIMITED_IMPORT_ROOM
        self.room_full = False
        # The links whose deliveries from another worker wait in their session, and those
        # that gave them back (``reclaim`` in session/outbound.py); ``check_stalls``: something
        # changed since they were last looked at (a connection starved, or a session holding
        # imports found its client's window or its writer closed).
        self.holding: dict[OutgoingLink, None] = {}
        self.stalled: dict[OutgoingLink, None] = {}
        self.check_stalls = False
        # Deliveries stalled links gave back to their queues, since the worker started.
        self.given_back = 0
        # Links whose deliveries no queue counts that asked for credit since the budget was
        # last blocked: what their queues may hold is taken back when it blocks again.
        self.uncounted: dict[OutgoingLink, None] = {}

    def reserve(self, link: OutgoingLink, nbytes: int) -> None:
        """What ``link``'s queue may still send is worth ``nbytes`` now."""
        reserved = link.reserved
        if nbytes == reserved:
            return
        self.reserved += nbytes - reserved
        link.reserved = nbytes
        if not nbytes:
            del self.reserving[link]
        elif not reserved:
            self.reserving[link] = None

    def starve(self, waiting: Waiting) -> None:
        """``waiting``'s connection waits for the budget: who holds the imports' part is
        looked at again at the next flush (its order among those waiting stays)."""
        self.starved[waiting] = None
        self.check_stalls = True

    def import_credit(self, link: OutgoingLink, credit: int) -> int:
        """``credit`` for ``link`` capped to what ``import_room`` lets its queue send beyond the
        deliveries that wait already (they count against it: session/outbound.py); 0 when
        not one more fits, and the request must wait."""
        room = self.room_for(link)
        more = room // import_unit(link)
        if more <= 0:
            # A link sent nothing yet is reserved a whole batch for its one delivery: it asks
            # while any room is left, reserved as that room (``Session._reserve``), or another
            # link's batch kept a fresh consumer out of the imports' part for good (adversary
            # seed 66100: the prober's new link on every renewed connection).
            return 1 if room > 0 and not link.largest and not link.waiting else 0
        return min(credit, len(link.waiting) + more)

    def room_for(self, link: OutgoingLink) -> int:
        """What ``link`` may have reserved within ``import_room``, beyond the others."""
        return self.import_room - self.reserved + link.reserved


class Waiting:
    """One connection's charge for the deliveries waiting in its sessions, against its limit."""

    __slots__ = (
        "bytes",
        "deferred",
        "limit",
        "paused",
        "pauses",
        "resume_at",
        "server",
        "writer",
    )

    def __init__(
        self, limit: int = DEFAULT_MAX_OUTGOING_PENDING, server: WaitingBytes | None = None
    ) -> None:
        if limit <= 0:
            raise ValueError(f"max_outgoing_pending_size must be positive, got {limit}")
        self.limit = limit
        self.resume_at = limit // 2
        self.server = WaitingBytes() if server is None else server
        # The connection's writer, whose unwritten bytes count with the waiting ones when the
        # connection asks for new bytes (:meth:`may_import`); set by the gateway.
        self.writer: Writer | None = None
        self.bytes = 0
        # Over the limit: credit requests wait in ``deferred`` until the bytes are at resume_at.
        self.paused = False
        self.pauses = 0
        # Links whose credit request waits, oldest first, with the request's drain flag: O(1)
        # to take the oldest and to forget a link that detaches.
        self.deferred: OrderedDict[OutgoingLink, bool] = OrderedDict()

    def charge(self, nbytes: int, server_nbytes: int | None = None, imported: int = 0) -> None:
        """Deliveries worth ``nbytes`` joined (or, negative, left) the connection's sessions,
        of which ``server_nbytes`` (all by default) are not counted elsewhere in the budget
        and ``imported`` are other workers' (the budget's imports' part).

        The connection is charged every byte its waiting deliveries hold, for its own limit;
        the server's total only what no queue counts already: a classic queue's unacked
        message is in the held bytes until settled, and counting it twice made a consumer
        that took a full queue's messages and did not read push the budget past its ceiling,
        holding every publisher on the server (issue 31's seed 3007, docs/adversary.md).
        """
        self.bytes += nbytes
        server = self.server
        server.total += nbytes if server_nbytes is None else server_nbytes
        server.imported += imported

    def defer(self, link: OutgoingLink, drain: bool) -> bool:
        """True if the link's credit request must wait (it is then kept, in order): the
        connection holds its limit, or the request would bring new bytes into a blocked
        budget (:class:`WaitingBytes`)."""
        credit = link.queue_flow_ctl.credit
        if credit:
            if link.imports and not self.may_ask(link, credit):
                self.deferred[link] = drain
                self.server.starve(self)
                return True
            if link.uncounted and not self.may_import():
                # Its connection waits for its own unsent bytes, or the budget: not for the
                # imports' part, so nothing another client holds there is taken back for it.
                self.deferred[link] = drain
                self.server.starved[self] = None
                return True
        if not self.paused:
            if self.bytes < self.limit:
                return False
            self.paused = True
            self.pauses += 1
        self.deferred[link] = drain
        return True

    def may_import(self) -> bool:
        """Whether the connection may ask for deliveries that are new bytes here now: another
        worker's, or a local queue's that no queue counts (:class:`WaitingBytes`)."""
        server = self.server
        if not server.blocked:
            return True
        writer = self.writer
        unsent = self.bytes + (0 if writer is None else writer.unwritten)
        return unsent == 0 if server.full else unsent < IMPORT_BATCH

    def may_ask(self, link: OutgoingLink, credit: int) -> bool:
        """Whether ``link`` may ask another worker for ``credit`` now: the connection may
        (:meth:`may_import`) and the server's room has a delivery's worth left for it."""
        if not self.may_import():
            return False
        if self.server.import_credit(link, credit):
            return True
        self.server.room_full = True
        return False

    def forget(self, link: OutgoingLink) -> bool | None:
        """Take the link's deferred request out (its drain flag; None if it had none): it
        detached, or is held and asks for none now. A connection left with none is no longer
        starved, so a closed one leaves nothing in the server's set."""
        drain = self.deferred.pop(link, None)
        if not self.deferred:
            self.server.starved.pop(self, None)
        return drain

    def backlogged(self, budget_exhausted: bool) -> bool:
        """Whether the connection holds as much unsent as it may: its limit, or anything at
        all while the memory budget is exhausted. What would add to it without a queue's credit
        (Direct Reply-To replies, management replies) is then dropped or refused, so that it
        costs this connection, never another client's service."""
        return self.bytes >= self.limit or (budget_exhausted and self.bytes > 0)

    @property
    def resumable(self) -> bool:
        """Enough has left the sessions for the deferred requests to go on: paused and back
        at ``resume_at``, or, starved (:class:`WaitingBytes`), allowed to ask again: an
        import once the server's room has some left, a local queue at once."""
        if self.paused:
            return self.bytes <= self.resume_at
        server = self.server
        if self not in server.starved or not self.may_import():
            return False
        head = next(iter(self.deferred), None)
        return head is None or not head.imports or server.reserved < server.import_room

    def next_deferred(self) -> tuple[OutgoingLink, bool] | None:
        """The oldest deferred request, while the bytes stay under the limit; None pauses again
        (or ends the pause once none is left)."""
        deferred = self.deferred
        if not deferred:
            self.paused = False
            self.server.starved.pop(self, None)
            return None
        if self.bytes >= self.limit:
            self.paused = True
            self.pauses += 1
            return None
        # Under the limit again: whatever still waits below waits for the budget (starved),
        # not for the bytes to fall to ``resume_at``, or it looked resumable for good.
        self.paused = False
        head = next(iter(deferred))
        credit = head.queue_flow_ctl.credit
        if head.imports and credit and not self.may_ask(head, credit):
            # Its bytes would be new here: it waits for the budget, and those behind it too;
            # a link whose credit was lent back (``Session.preempt``) makes no one else lend.
            if head.preempted:
                self.server.starved[self] = None
            else:
                self.server.starve(self)
            return None
        if head.uncounted and credit and not self.may_import():
            # Bytes no queue counts into a blocked budget: it waits as in :meth:`defer`.
            self.server.starved[self] = None
            return None
        return deferred.popitem(last=False)

    def statistics(self) -> WaitingStatistics:
        """Counts for metrics and tests."""
        return WaitingStatistics(
            bytes=self.bytes,
            limit=self.limit,
            resume_at=self.resume_at,
            paused=self.paused,
            pauses=self.pauses,
            deferred=len(self.deferred),
        )
