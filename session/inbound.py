"""The inbound half of flow control, free of IO: what one connection's publishers may send and owe.

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

Server-wide, session/inbound_flow.py's :class:`InboundFlow` holds the memory budget and
decides who waits for it. Every method returns what the gateway must do; the gateway only
applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from sluicegate.queues.held_bytes import copies_cost
from sluicegate.queues.queue_type import Outcome
from sluicegate.session.account import Account
from sluicegate.session.inbound_flow import RELEASE, Hold, InboundFlow, Release
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.wire.errors import AmqpError, MessageSizeExceeded

# What confirm() asks of the gateway, as bits: settle the delivery; read the socket again.
SETTLE: Final = 1
RESUME: Final = 2


class TransferLimitExceeded(AmqpError):
    """A transfer on a link with no credit left."""

    condition = "amqp:link:transfer-limit-exceeded"


class UnfinishedLimitExceeded(AmqpError):
    """A connection's deliveries still arriving over their limit, or stuck at the server's cap."""

    condition = "amqp:resource-limit-exceeded"


@dataclass(frozen=True, slots=True)
class CloseLink:
    """Detach the link with this error; its current delivery is settled and dropped."""

    link: IncomingLink
    error: AmqpError


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the whole connection with this error."""

    error: AmqpError


@dataclass(frozen=True, slots=True)
class Drop:
    """Settle the delivery and store nothing (it was aborted: AMQP 1.0 §2.6.14)."""


DROP: Final = Drop()
Refusal: TypeAlias = CloseLink | CloseConnection | Drop | Release


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


class Inbound:
    """One connection's publishing links, its account, and its unfinished deliveries; it joins
    the server-wide flow when it is made and leaves it with :meth:`release`."""

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
        flow.join(self)

    @property
    def paused(self) -> bool:
        """The socket must not be read: the account is too deep or the budget holds it."""
        return self.account.paused or self.budget_paused

    # -- links ----------------------------------------------------------------------------

    def attach(self, owner: object = None) -> IncomingLink:
        """A new publishing link (``owner``: the caller's record of it) whose ``credit`` is what
        its first FLOW grants (0 while blocked)."""
        flow = self.flow
        link = IncomingLink(flow.limits.max_link_credit, owner)
        self.links.add(link)
        if not link.attach(flow.budget.blocked):
            flow.renewals.add(link)
        return link

    def detach(self, link: IncomingLink) -> bool:
        """The link is gone: its unfinished delivery with it; copies in flight confirm nobody.

        True if that was the last publishing link of a connection the budget held: it is a
        consumer's connection now, which the budget never holds, so it may be read again.
        """
        self.links.discard(link)
        self.flow.renewals.discard(link)
        self.flow.forget(link)
        self._forget_unfinished(link)
        if self.budget_paused and not self.links:
            self.budget_paused = False
            return not self.account.paused
        return False

    def given_back(self, peer: int, link: IncomingLink) -> None:
        """Worker ``peer`` gave a publish of ``link`` back, its budget blocked: the link waits
        for it (``InboundFlow.given_back``), unless it is gone already: its copies in flight
        are confirmed after it detached, and a detached link that waited was granted credit,
        its record gone, when the owner stored again (adversary seed 65800)."""
        if link in self.links:
            self.flow.given_back(peer, link)

    def release(self) -> None:
        """The connection ended: forget every link and what it charged."""
        for link in list(self.links):
            self.detach(link)
        self.flow.leave(self)

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
                UnfinishedLimitExceeded(
                    f"unfinished deliveries over {limits.max_unfinished_size} bytes"
                )
            )
        held = self.flow.unfinished_charged(self, begins)
        return self.give_up(link) if held is RELEASE else held

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

    def route(
        self, link: IncomingLink, token: object, copies: int, size: int, whole: int = 0
    ) -> tuple[Unconfirmed, bool]:
        """The delivery of ``size`` bytes goes to ``copies`` queues, ``whole`` of them on other
        workers; True if reads must pause now. What one credit of the link may cost is its
        bytes, counted once however many queues here share them, each further copy's overhead,
        and the bytes again for each copy sent to another worker (queues/held_bytes.py): a
        renewal sized by the size alone let a publisher to a fanout of 50 queues, when each
        copy counted its bytes, take the budget 50 times past its headroom (adversary seed
        64101)."""
        cost = size + copies_cost(size, copies, whole)
        if cost > link.largest:
            link.largest = cost
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

    def give_up(self, link: IncomingLink) -> Release:
        """Give up the delivery arriving on ``link``, settled released: it began past the cap on
        unfinished bytes, or its bytes are beyond their part of a blocked budget's margin
        (session/inbound_flow.py)."""
        link.arriving = False
        self._forget_unfinished(link)
        link.confirm()
        self._want_credit(link)
        return RELEASE

    def _no_credit(self, link: IncomingLink) -> CloseLink:
        self._forget_unfinished(link)
        return CloseLink(link, TransferLimitExceeded("a transfer arrived with no link credit"))

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
    return CloseLink(link, MessageSizeExceeded(f"message larger than max-message-size {max_size}"))
