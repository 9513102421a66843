"""Unsettled deliveries to consumers, over every session: what the memory budget counts of them,
and which consumers it holds for taking more while it is blocked.

Each unsettled delivery costs the server :data:`UNSETTLED_DELIVERY_COST` beyond its message,
which its queue counts already: proton's delivery record and the queue's entry for it. A
consumer that takes deliveries and settles none grows that cost with every delivery, and a
blocked budget's publishers wait at their ceiling whoever grew the count: one consumer granting
100,000 credit on a queue of 15,000 small messages took an 8 MiB budget to 16.4 MB, and every
publisher on the server waited for as long as it stayed. So while the budget is blocked the
consumer links whose unsettled deliveries grew since are weighed with the publishers that grew
(session/inbound_flow.py), and each has a *share*: what a publisher that grew may take of the
room left below the publishers' ceiling, in deliveries. A request to its queue asks for no more
than what is left of its share, nor than is left of a quarter of that room, shared by all
(:meth:`Unsettled.grant`), and the delivery that reaches its share *holds* the link at once
(:meth:`Unsettled.reach`): decided at the flushes only, 32 links took a local queue's batch of
256 each between two of them, 4 MB past the ceiling, and with shares decided before they grew,
each took a share of their own, 0.2 MB past it. A held link's
session asks its queue for nothing and takes back what it holds (session/outbound.py) until the
link settles back under its share or the budget lets go. A consumer that settles as it goes
never grows, and is never held.
"""

from __future__ import annotations

from typing import Final

from sluicegate.session.outgoing_link import OutgoingLink

# What the server holds per unsettled outgoing delivery beyond the queued message: proton's
# delivery record with its emptied buffer and tag, and the queue's entry for it, measured by
# test_an_unsettled_delivery_costs_at_most_a_kibibyte_beyond_its_message in
# tests/integration/test_memory_bounds.py; the memory budget counts it.
UNSETTLED_DELIVERY_COST: Final = 512


class Unsettled:
    """The server's unsettled deliveries, and their growth while the memory budget is blocked."""

    __slots__ = ("blocked", "count", "held", "reached", "room", "settled", "share", "since")

    def __init__(self) -> None:
        self.count = 0
        # The memory budget is blocked (set at each flush of session/inbound_flow.py).
        self.blocked = False
        # While blocked: each link that took a delivery unsettled since, with how many it held
        # unsettled before that one (:meth:`grown` is what it took beyond).
        self.since: dict[OutgoingLink, int] = {}
        # How many deliveries a link may take unsettled beyond those before it is held, as the
        # holds were last decided (one until they are).
        self.share = 1
        # Deliveries the requests of all links may still ask for until the holds are decided
        # again: a quarter of the room left below the publishers' ceiling as they were.
        self.room = 0
        # The links held for their growth, until it is back under their share or the budget
        # lets go; of them, those a delivery held since the last flush (:meth:`reach`), whose
        # queues' credit is taken back at it.
        self.held: dict[OutgoingLink, None] = {}
        self.reached: dict[OutgoingLink, None] = {}
        # Held links that settled since the last flush: let go at it if back under their
        # share, whether or not the bytes moved enough for the holds to be decided again.
        self.settled: dict[OutgoingLink, None] = {}

    def grown(self) -> dict[OutgoingLink, int]:
        """How many deliveries each link took unsettled beyond those it held as the budget
        blocked (fewer if it settled since: then none or less)."""
        return {link: link.unsettled - before for link, before in self.since.items()}

    def grant(self, link: OutgoingLink, credit: int) -> int:
        """What of ``credit`` a request of ``link`` may ask its queue for while blocked: no more
        than is left of its share and of the room, which it takes, but one for a link that
        holds no more than when the budget blocked, whatever the room: a consumer settling as
        it goes is what brings the bytes down, and held with the room spent, it could never
        drain the queues that hold the budget. None: the link is held (:meth:`reach`), until
        the holds are decided again or it settles."""
        grown = link.unsettled - self.since.get(link, link.unsettled)
        room = self.room if grown > 0 else max(self.room, 1)
        granted = min(credit, self.share - grown, room)
        if granted <= 0:
            self.reach(link)
            return 0
        self.room = max(0, self.room - granted)
        return granted

    def reach(self, link: OutgoingLink) -> None:
        """A delivery took ``link`` to its share: held now, so that its session asks its queue
        for no more in this pass; what the queue holds is taken back at the flush."""
        link.held = True
        self.hold(link)
        self.reached[link] = None

    def hold(self, link: OutgoingLink) -> None:
        """``link`` is held for its growth (its session asks its queue for no more)."""
        link.unsettled_held = True
        self.held[link] = None

    def release(self, link: OutgoingLink) -> None:
        """``link`` is no longer held for its growth."""
        link.unsettled_held = False
        self.held.pop(link, None)

    def back_under(self) -> list[OutgoingLink]:
        """The held links that settled since the last flush and are under their share now;
        the settled are forgotten."""
        settled = self.settled
        since = self.since
        share = self.share
        under = [link for link in settled if link.unsettled - since[link] < share]
        settled.clear()
        return under

    def let_go(self) -> list[OutgoingLink]:
        """The budget let go: growth is forgotten; the links held, for their sessions to let go."""
        self.blocked = False
        self.share = 1
        self.room = 0
        self.since.clear()
        self.settled.clear()
        self.reached.clear()
        return list(self.held)

    def forget(self, link: OutgoingLink) -> None:
        """``link`` detached: nothing here names it."""
        self.since.pop(link, None)
        self.held.pop(link, None)
        self.settled.pop(link, None)
        self.reached.pop(link, None)
