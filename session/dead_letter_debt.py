"""A connection's dead-letter debt: the fan-out its consumers' outcomes made the server do.

A consumer that rejects a message (or settles it ``modified`` undeliverable-here, or past its
delivery limit) in a queue whose dead-letter exchange fans out to N queues makes the server copy
it N times. That work is the consumer's doing, so it is charged to it as a publisher's routed
copies are charged to the publisher (session/account.py): one unit a letter until its copies are
known, one per copy once the memory budget makes it wait, repaid when it leaves the outbox
(queues/dead_lettering.py). Each consumer link owes its own letters (:class:`LinkLetters`);
the limit is the connection's (:class:`DeadLetterDebt`), so a client cannot multiply it by
opening links.

At the limit the links that owe letters are *held*: their session asks their queues for no
more credit and takes back what the queues hold (session/outbound.py), so no new delivery
reaches them. The connection's socket is still read, since its settlements are what free the
budget the letters wait for (pausing its reads instead never resumed: the revert c8603bc), and
its links that owe nothing (a consumer of the dead-letter queues, say) are served on. A link
that makes letters while the connection is over its limit is held as well. Every held link is
let go once the debt is back at half the limit (docs/outbound-flow-control.md). The letters of
deliveries returned as a link detaches or a connection closes (past their delivery limit) have
no link left to hold: the memory budget alone bounds them (docs/bounds.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.session.account import DEFAULT_ACCOUNT_LIMIT
from sluicegate.session.outgoing_link import OutgoingLink


@dataclass(frozen=True, slots=True)
class DeadLetterDebtStatistics:
    """A connection's dead-letter debt for metrics and tests."""

    debt: int
    limit: int
    resume_at: int
    held: bool
    holds: int
    borrowed: int
    owing_links: int
    held_links: int


class LinkLetters:
    """One consumer link's letters not yet stored: the cause the router charges."""

    __slots__ = ("debt", "link", "owed")

    def __init__(self, debt: DeadLetterDebt, link: OutgoingLink) -> None:
        self.debt = debt
        self.link = link
        self.owed = 0

    def borrow(self, units: int) -> bool:
        """Charge ``units`` of letters to the link; True if the hold is to be applied now
        (:func:`session.outbound.apply_hold`)."""
        self.owed += units
        return self.debt.borrowed_by(self, units)

    def repay(self, units: int) -> bool:
        """Letters worth ``units`` left the outbox; True if the hold is to be lifted now."""
        if units > self.owed:
            raise ValueError(f"repaying {units} units of a link's {self.owed}")
        self.owed -= units
        return self.debt.repaid_by(self, units)


class DeadLetterDebt:
    """What one connection's consumer links owe in dead letters, and whether they are held."""

    __slots__ = ("borrowed", "causes", "debt", "held", "holds", "limit", "resume_at")

    def __init__(self, limit: int = DEFAULT_ACCOUNT_LIMIT) -> None:
        if limit <= 0:
            raise ValueError(f"dead-letter debt limit must be positive, got {limit}")
        self.limit = limit
        self.resume_at = limit // 2
        self.debt = 0
        # At the limit, until the debt is back at resume_at.
        self.held = False
        self.holds = 0
        self.borrowed = 0
        # The links that owe letters or are held, in the order they first owed.
        self.causes: dict[OutgoingLink, LinkLetters] = {}

    def cause(self, link: OutgoingLink) -> LinkLetters:
        """The share of ``link``, which its letters are charged to."""
        cause = self.causes.get(link)
        if cause is None:
            cause = self.causes[link] = LinkLetters(self, link)
        return cause

    def borrowed_by(self, cause: LinkLetters, units: int) -> bool:
        """``cause`` owes ``units`` more: True if the connection reaches its limit now, or is
        over it and that link is not held yet."""
        self.debt += units
        self.borrowed += units
        if self.held:
            return not cause.link.debt_held
        if self.debt >= self.limit:
            self.held = True
            self.holds += 1
            return True
        return False

    def repaid_by(self, cause: LinkLetters, units: int) -> bool:
        """``cause`` was repaid ``units``: True if the debt is back at half the limit now."""
        self.debt -= units
        link = cause.link
        if cause.owed == 0 and (link.detached or not link.debt_held):
            self.causes.pop(link, None)
        if self.held and self.debt <= self.resume_at:
            self.held = False
            return True
        return False

    def to_hold(self) -> list[OutgoingLink]:
        """While held: the live links that owe letters and are not held yet."""
        if not self.held:
            return []
        return [
            link
            for link, cause in self.causes.items()
            if cause.owed and not link.debt_held and not link.detached
        ]

    def let_go(self) -> list[OutgoingLink]:
        """Once no longer held: the live links still held, for their sessions to release;
        every link but those that owe letters is forgotten."""
        if self.held:
            return []
        links = [link for link in self.causes if link.debt_held and not link.detached]
        for link, cause in list(self.causes.items()):
            if not cause.owed:
                del self.causes[link]
        return links

    def statistics(self) -> DeadLetterDebtStatistics:
        """Counts for metrics and tests."""
        return DeadLetterDebtStatistics(
            debt=self.debt,
            limit=self.limit,
            resume_at=self.resume_at,
            held=self.held,
            holds=self.holds,
            borrowed=self.borrowed,
            owing_links=sum(1 for cause in self.causes.values() if cause.owed),
            held_links=sum(1 for link in self.causes if link.debt_held and not link.detached),
        )
