"""A publisher's link as the session sees it: credit that follows confirmations.

RabbitMQ 4 grants ``max_link_credit`` on ATTACH and renews it only when the credit left has
fallen to half **and** the link has fewer than ``max_link_credit`` messages still unconfirmed
(``grant_link_credit``). Credit therefore follows storage, not receipt: a target that stores
slowly (an fsync, a full queue) throttles only the links that publish to it.

The link also carries what the memory budget needs to know of it (docs/inbound-flow-control.md):
the bytes of the delivery still arriving, the largest message it sent (a renewal is sized so
that the budget's headroom backs it), and whether the budget holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from sluicegate.session.remote_publishers import FIRST_LINK, PUBLISHER_STEP

# Numbers for links, unique in a worker for its life: what names a link to the other workers
# that store its copies (session/remote_publishers.py).
_serials = count(FIRST_LINK, PUBLISHER_STEP)


@dataclass(frozen=True, slots=True)
class IncomingLinkStatistics:
    """A publishing link's flow-control state for metrics and tests."""

    credit: int
    unconfirmed: int
    received: int
    confirmed: int
    max_link_credit: int
    unfinished: int = 0
    held: bool = False


class IncomingLink:
    """Credit granted to one publisher and the messages it sent that are not yet stored."""

    __slots__ = (
        "__weakref__",
        "arriving",
        "confirmed",
        "credit",
        "half",
        "held",
        "largest",
        "max_link_credit",
        "owner",
        "owner_full",
        "received",
        "serial",
        "unconfirmed",
        "unfinished",
        "weight_at_block",
    )

    def __init__(self, max_link_credit: int, owner: object = None) -> None:
        if max_link_credit <= 0:
            raise ValueError(f"max_link_credit must be positive, got {max_link_credit}")
        self.max_link_credit = max_link_credit
        self.half = max_link_credit // 2
        self.credit = 0
        self.unconfirmed = 0
        self.received = 0
        self.confirmed = 0
        # A delivery has begun (its first frame took a credit) and not yet ended.
        self.arriving = False
        # Bytes of that delivery received so far.
        self.unfinished = 0
        # The most one whole message received cost the budget: its size and its copies'
        # overhead.
        self.largest = 0
        # Publishing to queues that hold the budget while it is exhausted: no new credit.
        self.held = False
        # What its queues weighed when the budget was first weighed blocked with it (None:
        # not since the budget last let go): what they grew by since fills the margin.
        self.weight_at_block: int | None = None
        # The other worker that gave a publish of it back for its blocked budget, until that
        # worker stores one again (session/inbound_flow.py): no new credit meanwhile.
        self.owner_full: int | None = None
        # The gateway's record of the link, for the actions it is named in; never read here.
        self.owner = owner
        # What its copies to another worker's queues are charged to there.
        self.serial = next(_serials)

    def attach(self, blocked: bool = False) -> int:
        """The credit of the first FLOW: everything, unless the server is over its budget."""
        if blocked:
            return 0
        self.credit = self.max_link_credit
        return self.credit

    def receive(self) -> bool:
        """Count one transfer; False if it came with no credit (transfer-limit-exceeded)."""
        if self.credit <= 0:
            return False
        self.credit -= 1
        self.unconfirmed += 1
        self.received += 1
        return True

    def confirm(self) -> None:
        """One received message is now settled: stored in every queue, or refused."""
        self.unconfirmed -= 1
        self.confirmed += 1

    @property
    def wants_credit(self) -> bool:
        """True when the credit left is at most half: the link may need a renewal."""
        return self.credit <= self.half

    def renew(self, blocked: bool = False, headroom: int | None = None) -> int:
        """Credit to add in a FLOW now (0: none), by RabbitMQ's rule; the server may block it.

        ``headroom`` is the budget's room in bytes: the grant is cut so that the link's largest
        message times the credit fits in it, but never below one while there is room at all.
        """
        if (
            blocked
            or self.owner_full is not None
            or self.credit > self.half
            or self.unconfirmed >= self.max_link_credit
        ):
            return 0
        grant = self.max_link_credit - self.credit
        if headroom is not None:
            if headroom <= 0:
                return 0
            if self.largest:
                grant = max(1, min(grant, headroom // self.largest))
        self.credit += grant
        return grant

    def statistics(self) -> IncomingLinkStatistics:
        """Counts for metrics and tests."""
        return IncomingLinkStatistics(
            credit=self.credit,
            unconfirmed=self.unconfirmed,
            received=self.received,
            confirmed=self.confirmed,
            max_link_credit=self.max_link_credit,
            unfinished=self.unfinished,
            held=self.held,
        )
