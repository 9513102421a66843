"""The inbound half of flow control, free of IO: what publishers may send, owe, and who waits.

Per connection, :class:`Inbound` follows each transfer of its publishers' links:

- **receive**: a delivery takes one link credit with its first frame (a transfer without credit
  detaches the link with ``amqp:link:transfer-limit-exceeded``); the bytes of a delivery still
  arriving are charged to the connection and to the server's budget frame by frame, capped by
  ``max_message_size`` per delivery (``amqp:link:message-size-exceeded``) and by
  ``max_unfinished_size`` per connection (``amqp:resource-limit-exceeded`` closes it) and by
  ``max_unfinished_total`` over all connections (beyond it, connections with a delivery
  arriving are not read, but for the oldest);
- **route**: every routed copy borrows one unit of the connection's account (Syndicate); at the
  account's limit the connection's socket is no longer read;
- **confirm**: each stored (or refused) copy repays its unit; the last one settles the delivery
  with its outcome (a ``rejected`` copy wins, then the last other refusal, else ``accepted``) and
  frees a place in the link's unconfirmed count.

Server-wide, :class:`InboundFlow` holds the memory budget and, at the end of every batch of
events, **flushes**: it takes the bytes held, decides who waits while the budget is exhausted
(docs/inbound-flow-control.md), and renews the credit of links that may have more, each grant
cut to what the budget's headroom backs. Bytes read from a publishing connection are charged at
once, so one pass of the reactor over many connections cannot overshoot the budget by more than
one read. Every method returns what the gateway must do; the gateway only applies it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from sluicegate.queues.queue_type import Outcome
from sluicegate.session.account import Account
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import DEFAULT_RESUME_RATIO, MemoryBudget
from sluicegate.wire.errors import AmqpError

# What confirm() asks of the gateway, as bits: settle the delivery; read the socket again.
SETTLE: Final = 1
RESUME: Final = 2

# While blocked, the holds are decided again once the bytes held moved by this share of the
# budget: often enough to follow consumers draining, rarely enough to stay O(1) per event.
RECLASSIFY_SHARE: Final = 16


@dataclass(frozen=True, slots=True)
class InboundLimits:
    """The per-link and per-connection limits a publisher must keep."""

    max_link_credit: int
    max_message_size: int
    # Bytes of unfinished (multi-frame) deliveries one connection may have at once.
    max_unfinished_size: int
    # Bytes of unfinished deliveries all connections may have together; None: only the budget.
    max_unfinished_total: int | None = None
    # Seconds the oldest of them may make no progress while they are at that cap; 0: forever.
    unfinished_timeout: float = 0.0


@dataclass(frozen=True, slots=True)
class CloseLink:
    """Detach the link with this error; its current delivery is settled and dropped."""

    link: IncomingLink
    condition: str
    description: str


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the whole connection with this error."""

    condition: str
    description: str


@dataclass(frozen=True, slots=True)
class Drop:
    """Settle the delivery and store nothing (it was aborted: AMQP 1.0 §2.6.14)."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Stop reading these connections: the server's unfinished deliveries are at their cap."""

    connections: list[Inbound]


@dataclass(frozen=True, slots=True)
class Release:
    """Settle the delivery ``released`` and store nothing; the link goes on (AMQP 1.0 §3.4.4).

    A delivery that begins while the server's unfinished bytes are at their cap: holding it
    would hold what its first read brought, once per connection; released, the client may send
    it again later.
    """


DROP: Final = Drop()
RELEASE: Final = Release()
Refusal: TypeAlias = CloseLink | CloseConnection | Drop | Release
# The bytes held by the queues a link publishes to (the gateway knows its targets).
Weigh: TypeAlias = Callable[[IncomingLink], int]


class Unconfirmed:
    """A received delivery whose routed copies are not all stored yet.

    ``token`` is the gateway's handle on the delivery, carried through untouched.
    """

    __slots__ = ("copies", "error", "inbound", "link", "outcome", "token")

    def __init__(self, token: object, inbound: Inbound, link: IncomingLink, copies: int) -> None:
        self.token = token
        self.inbound = inbound
        self.link = link
        self.copies = copies
        # The outcome the publisher gets: accepted unless some queue refused its copy.
        self.outcome = Outcome.ACCEPTED
        # Why a copy was refused, if one was and said why (the outcome's error condition).
        self.error: AmqpError | None = None

    def refuse(self, outcome: Outcome, error: AmqpError | None) -> None:
        """A copy was refused: a rejection sticks, any other refusal replaces what was."""
        if outcome is not Outcome.ACCEPTED and self.outcome is not Outcome.REJECTED:
            self.outcome = outcome
            self.error = error


@dataclass(slots=True)
class Flushed:
    """What a flush asks of the gateway: FLOWs to send, connections to stop or start reading."""

    grants: list[tuple[IncomingLink, int]] = field(default_factory=list)
    pause: list[Inbound] = field(default_factory=list)
    resume: list[Inbound] = field(default_factory=list)
    # Connections to close: their delivery, the oldest, made no progress within the timeout.
    close: list[Inbound] = field(default_factory=list)


class Inbound:
    """One connection's publishing links, its account, and its unfinished deliveries."""

    __slots__ = ("__weakref__", "account", "budget_paused", "flow", "links", "owner", "unfinished")

    def __init__(self, flow: InboundFlow, account: Account, owner: object = None) -> None:
        self.flow = flow
        self.account = account
        # The gateway's record of the connection, for the actions it is named in.
        self.owner = owner
        self.links: set[IncomingLink] = set()
        # Bytes of this connection's deliveries still arriving.
        self.unfinished = 0
        # The budget holds this connection's reads (see InboundFlow).
        self.budget_paused = False

    @property
    def paused(self) -> bool:
        """The socket must not be read: the account is too deep or the budget holds it."""
        return self.account.paused or self.budget_paused

    # -- links ----------------------------------------------------------------------------

    def attach(self) -> tuple[IncomingLink, int]:
        """A new publishing link and the credit of its first FLOW (0 while blocked)."""
        flow = self.flow
        link = IncomingLink(flow.limits.max_link_credit)
        self.links.add(link)
        credit = link.attach(flow.budget.blocked)
        if not credit:
            flow.renewals.add(link)
        return link, credit

    def detach(self, link: IncomingLink) -> bool:
        """The link is gone: its unfinished delivery with it; copies in flight confirm nobody.

        True if that was the last publishing link of a connection the budget held: it is a
        consumer's connection now, which the budget never holds, so it may be read again.
        """
        self.links.discard(link)
        self.flow.renewals.discard(link)
        self._forget_unfinished(link)
        if self.budget_paused and not self.links:
            self.budget_paused = False
            return not self.account.paused
        return False

    def release(self) -> None:
        """The connection ended: forget every link and what it charged."""
        for link in list(self.links):
            self.detach(link)
        flow = self.flow
        flow.connections.discard(self)
        if flow.watched is self:
            flow.watched = None

    # -- transfers ------------------------------------------------------------------------

    def frame(self, link: IncomingLink, received: int) -> Refusal | Hold | None:
        """A delivery is still arriving and has ``received`` bytes so far: charge them.

        Past the server-wide cap on unfinished bytes the connection is held (:class:`Hold`),
        unless its delivery is the oldest arriving, and a delivery that begins is released.
        """
        limits = self.flow.limits
        begins = not link.arriving
        if begins:
            if not link.receive():
                return self._no_credit(link)
            link.arriving = True
        if received > limits.max_message_size:
            self._forget_unfinished(link)
            return _oversized(link, limits.max_message_size)
        self._charge(link, received - link.unfinished)
        if self.unfinished > limits.max_unfinished_size:
            return CloseConnection(
                "amqp:resource-limit-exceeded",
                f"unfinished deliveries over {limits.max_unfinished_size} bytes",
            )
        held = self.flow.unfinished_charged(self, begins)
        return self._release(link) if held is RELEASE else held

    def receive(self, link: IncomingLink, size: int, aborted: bool) -> Refusal | None:
        """The delivery's last frame arrived: None if its ``size`` bytes are to be stored."""
        if link.arriving:
            link.arriving = False
            self._forget_unfinished(link)
        elif not link.receive():
            return self._no_credit(link)
        if aborted:
            link.confirm()
            self._want_credit(link)
            return DROP
        max_size = self.flow.limits.max_message_size
        if size > max_size:
            return _oversized(link, max_size)
        if size > link.largest:
            link.largest = size
        return None

    def route(self, link: IncomingLink, token: object, copies: int) -> tuple[Unconfirmed, bool]:
        """The delivery goes to ``copies`` queues; True if reads must pause now."""
        pending = Unconfirmed(token, self, link, copies)
        return pending, bool(copies) and self.account.borrow(copies)

    def confirm(
        self,
        pending: Unconfirmed,
        outcome: Outcome = Outcome.ACCEPTED,
        error: AmqpError | None = None,
    ) -> int:
        """One copy stored (or refused): SETTLE when it was the last, RESUME if reads may."""
        if outcome is not Outcome.ACCEPTED:
            pending.refuse(outcome, error)
        steps = RESUME if self.account.repay(1) and not self.budget_paused else 0
        pending.copies -= 1
        if pending.copies == 0:
            self.settled(pending)
            steps |= SETTLE
        return steps

    def settled(self, pending: Unconfirmed) -> None:
        """The delivery is settled (its last copy, or it was routed nowhere)."""
        link = pending.link
        link.confirm()
        self._want_credit(link)

    # -- internals ------------------------------------------------------------------------

    def _want_credit(self, link: IncomingLink) -> None:
        if link.wants_credit and link in self.links:
            self.flow.renewals.add(link)

    def _release(self, link: IncomingLink) -> Release:
        """Give up a delivery that began past the cap on unfinished bytes: settled released."""
        link.arriving = False
        self._forget_unfinished(link)
        link.confirm()
        self._want_credit(link)
        return RELEASE

    def _no_credit(self, link: IncomingLink) -> CloseLink:
        self._forget_unfinished(link)
        return CloseLink(
            link, "amqp:link:transfer-limit-exceeded", "a transfer arrived with no link credit"
        )

    def _charge(self, link: IncomingLink, more: int) -> None:
        if more <= 0:
            return
        flow = self.flow
        if not self.unfinished:
            flow.arriving[self] = None
        link.unfinished += more
        self.unfinished += more
        flow.budget.unfinished += more

    def _forget_unfinished(self, link: IncomingLink) -> None:
        held = link.unfinished
        if not held:
            return
        link.unfinished = 0
        self.unfinished -= held
        flow = self.flow
        flow.budget.unfinished -= held
        if not self.unfinished:
            flow.arriving.pop(self, None)


def _oversized(link: IncomingLink, max_size: int) -> CloseLink:
    return CloseLink(
        link, "amqp:link:message-size-exceeded", f"message larger than max-message-size {max_size}"
    )


class InboundFlow:
    """Every connection's publishers against the server's memory budget.

    While the budget is exhausted (used at or above its limit, until it is back at its low-water
    mark), the links publishing to the queues that hold the budget are *held*: a link is held
    when the bytes its queues hold are at least half the mean over all publishing links (the
    gateway weighs them). Held links get no new credit, and a connection that still has credit
    on a held link, or a delivery arriving, is not read. Every other publisher keeps its credit
    renewals, backed by the margin above the limit up to ``ceiling``; at the ceiling no
    publishing connection is read at all.

    Bytes of deliveries still arriving are bytes no consumer can drain, so they have a cap of
    their own, ``max_unfinished_total``, below the budget: from the moment they reach it until
    they are back at 80 % of it, every connection with a delivery arriving is held, so that they
    cannot take the budget's room from the publishers whose messages are consumed.

    Whatever the case, the connection whose unfinished delivery is the oldest is always read, so
    that multi-frame messages finish and the budget cannot be locked up by deliveries that wait
    for each other. Connections without publishing links are never held: consumers keep
    consuming, which is what brings the bytes down.
    """

    def __init__(self, budget: MemoryBudget, limits: InboundLimits) -> None:
        self.budget = budget
        self.limits = limits
        self.connections: set[Inbound] = set()
        # Connections with a delivery arriving, oldest first (a dict keeps insertion order).
        self.arriving: dict[Inbound, None] = {}
        # Links whose credit fell to half: renewed at the next flush.
        self.renewals: set[IncomingLink] = set()
        # The unfinished bytes reached max_unfinished_total and are not back at 80 % of it.
        self.unfinished_full = False
        total = limits.max_unfinished_total
        self._unfinished_resume = None if total is None else int(total * DEFAULT_RESUME_RATIO)
        # Bytes read since the last flush from connections with a delivery arriving.
        self._unfinished_reading = 0
        # While the cap is reached: the oldest arriving connection, its unfinished bytes, and
        # since when they have not changed (its deadline is unfinished_timeout from then).
        self.watched: Inbound | None = None
        self._watched_bytes = 0
        self._watched_since = 0.0
        # The holds were decided for the bytes held at this figure (None: to be decided).
        self._classified_at: int | None = None
        # They were decided with the bytes held at or above the ceiling.
        self._over_ceiling = False
        self._oldest: Inbound | None = None

    def connection(self, account: Account, owner: object = None) -> Inbound:
        """The inbound state of a new connection; ``owner`` is the caller's record of it."""
        inbound = Inbound(self, account, owner)
        self.connections.add(inbound)
        return inbound

    def charge_read(self, inbound: Inbound, nbytes: int) -> list[Inbound]:
        """Bytes were read from ``inbound``'s socket: connections whose reads pause now.

        Only connections with publishing links are charged; the charge stands until the next
        flush counts what the bytes became. The first read that exhausts the budget, or reaches
        its ceiling, pauses every publishing connection but the oldest arriving one until the
        flush decides; the first read that takes the unfinished bytes to their cap pauses every
        connection with a delivery arriving but the oldest.
        """
        if not inbound.links:
            return []
        budget = self.budget
        budget.reading += nbytes
        hold = False
        if inbound.unfinished:
            self._unfinished_reading += nbytes
            total = self.limits.max_unfinished_total
            if (
                total is not None
                and not self.unfinished_full
                and budget.unfinished + self._unfinished_reading >= total
            ):
                self.unfinished_full = hold = True
        if budget.blocked:
            if not self._over_ceiling and budget.current >= budget.ceiling:
                self._over_ceiling = hold = True
        elif budget.current >= budget.limit:
            budget.block()
            self._classified_at = None
            hold = True
        return self._hold().pause if hold else []

    def unfinished_charged(self, inbound: Inbound, begins: bool) -> Hold | Release | None:
        """A delivery of ``inbound`` grew (``begins``: it is new): apply the unfinished cap.

        Reaching the cap holds every connection with a delivery arriving but the oldest; past
        it, a delivery that begins is released and one that goes on holds its connection.
        """
        total = self.limits.max_unfinished_total
        if total is None:
            return None
        if not self.unfinished_full:
            if self.budget.unfinished < total:
                return None
            self.unfinished_full = True
            return Hold(self._hold().pause)
        if begins:
            return RELEASE
        if inbound.budget_paused or inbound is next(iter(self.arriving)):
            return None
        inbound.budget_paused = True
        return Hold([inbound])

    def flush(self, queued: int, outbound: int, weigh: Weigh, now: float = 0.0) -> Flushed | None:
        """The end of a batch of events: take the bytes held, decide holds, renew credit, and
        close the oldest arriving connection if it held the cap without progress too long."""
        budget = self.budget
        was_blocked = budget.blocked
        budget.update(queued + outbound + budget.unfinished)
        self._unfinished_reading = 0
        moved = False
        resume = self._unfinished_resume
        if self.unfinished_full and resume is not None and budget.unfinished <= resume:
            self.unfinished_full = False
            moved = True
        oldest = next(iter(self.arriving), None)
        out: Flushed | None = None
        if budget.blocked:
            classified = self._classified_at
            if (
                classified is None
                or not was_blocked
                or oldest is not self._oldest
                or (budget.used >= budget.ceiling) != self._over_ceiling
                or abs(budget.used - classified) * RECLASSIFY_SHARE >= budget.limit
            ):
                out = self._classify(weigh)
        elif was_blocked:
            out = self._release()
        if out is None and (moved or (self.unfinished_full and oldest is not self._oldest)):
            out = self._hold()
        self._oldest = oldest
        if self._overdue(oldest, now):
            assert oldest is not None
            if out is None:
                out = Flushed()
            out.close.append(oldest)
        renewals = self.renewals
        if renewals:
            if out is None:
                out = Flushed()
            self._renew(out.grants)
        return out

    # -- internals ------------------------------------------------------------------------

    def _overdue(self, oldest: Inbound | None, now: float) -> bool:
        """Whether ``oldest`` has kept the unfinished cap full without a byte for the timeout.

        Checked at flushes, which others' traffic brings: a deadline that passes while nobody
        else does anything hurts nobody until they do.
        """
        timeout = self.limits.unfinished_timeout
        if not (timeout and self.unfinished_full and oldest is not None):
            self.watched = None
            return False
        if oldest is not self.watched or oldest.unfinished != self._watched_bytes:
            self.watched = oldest
            self._watched_bytes = oldest.unfinished
            self._watched_since = now
            return False
        if now - self._watched_since < timeout:
            return False
        self.watched = None
        return True

    def _classify(self, weigh: Weigh) -> Flushed:
        """Decide again which links and connections the exhausted budget holds."""
        budget = self.budget
        self._classified_at = budget.used
        self._over_ceiling = budget.used >= budget.ceiling
        links = [link for inbound in self.connections for link in inbound.links]
        weights = [weigh(link) for link in links]
        positive = [weight for weight in weights if weight > 0]
        mean = sum(positive) / len(positive) if positive else 0.0
        for link, weight in zip(links, weights, strict=True):
            was_held = link.held
            link.held = mean > 0 and 2 * weight >= mean
            if was_held and not link.held and link.wants_credit:
                self.renewals.add(link)
        return self._hold()

    def _release(self) -> Flushed:
        """The budget is back under its low-water mark: nobody is held for it any more."""
        self._classified_at = None
        self._over_ceiling = False
        for inbound in self.connections:
            for link in inbound.links:
                link.held = False
                if link.wants_credit:
                    self.renewals.add(link)
        return self._hold()

    def _holds(self, inbound: Inbound) -> bool:
        """Whether the budget or the cap on unfinished bytes keeps ``inbound`` unread."""
        if inbound.unfinished and self.unfinished_full:
            return True
        if not self.budget.blocked:
            return False
        return (
            self._classified_at is None
            or self._over_ceiling
            or inbound.unfinished > 0
            or any(link.held and link.credit > 0 for link in inbound.links)
        )

    def _hold(self) -> Flushed:
        """Hold the publishing connections :meth:`_holds` names, but never the oldest arriving."""
        out = Flushed()
        oldest = next(iter(self.arriving), None)
        for inbound in self.connections:
            hold = bool(inbound.links) and inbound is not oldest and self._holds(inbound)
            if hold != inbound.budget_paused:
                inbound.budget_paused = hold
                (out.pause if hold else out.resume).append(inbound)
        return out

    def _renew(self, grants: list[tuple[IncomingLink, int]]) -> None:
        """Renew what the rule allows, each grant backed by the budget's headroom."""
        budget = self.budget
        blocked = budget.blocked
        headroom = (budget.ceiling if blocked else budget.limit) - budget.current
        renewals = self.renewals
        while renewals:
            link = renewals.pop()
            if blocked and link.held:
                continue  # renewed when the budget lets it go
            grant = link.renew(headroom=headroom)
            if grant:
                grants.append((link, grant))
                headroom -= grant * link.largest
