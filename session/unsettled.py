"""Unsettled deliveries to consumers, over every session: what the memory budget counts of them,
and which consumers it holds for taking more while it is blocked.

Each unsettled delivery costs the server :data:`UNSETTLED_DELIVERY_COST` beyond its message,
which its queue counts already: proton's delivery record and the queue's entry for it. A
consumer that takes deliveries and settles none grows that cost with every delivery, and a
blocked budget's publishers wait at their ceiling whoever grew the count: one consumer granting
100,000 credit on a queue of 15,000 small messages took an 8 MiB budget to 16.4 MB, and every
publisher on the server waited for as long as it stayed. So while the budget is blocked the
consumer links whose unsettled deliveries grew since are weighed with the publishers that grew
(session/inbound_flow.py): a link grown by its share of the publishers' part left is *held*,
its session asking its queue for no more credit and taking back what the queue holds
(session/outbound.py), until it settles back under its share or the budget lets go. A consumer
that settles as it goes never grows, and is never held.
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

    __slots__ = ("blocked", "count", "held", "settled", "since")

    def __init__(self) -> None:
        self.count = 0
        # The memory budget is blocked (set at each flush of session/inbound_flow.py).
        self.blocked = False
        # While blocked: each link that took a delivery unsettled since, with how many it held
        # unsettled before that one (:meth:`grown` is what it took beyond).
        self.since: dict[OutgoingLink, int] = {}
        # The links held for their growth, until it is back under their share or the budget
        # lets go.
        self.held: dict[OutgoingLink, None] = {}
        # Held links that settled since the last flush: let go at it if back under their
        # share, whether or not the bytes moved enough for the holds to be decided again.
        self.settled: dict[OutgoingLink, None] = {}

    def grown(self) -> dict[OutgoingLink, int]:
        """The bytes each link's unsettled deliveries grew by since the budget blocked."""
        return {
            link: (link.unsettled - before) * UNSETTLED_DELIVERY_COST
            for link, before in self.since.items()
        }

    def hold(self, link: OutgoingLink) -> None:
        """``link`` is held for its growth (its session asks its queue for no more)."""
        link.unsettled_held = True
        self.held[link] = None

    def release(self, link: OutgoingLink) -> None:
        """``link`` is no longer held for its growth."""
        link.unsettled_held = False
        self.held.pop(link, None)

    def back_under(self, share: float) -> list[OutgoingLink]:
        """The held links that settled since the last flush and grew by less than ``share``
        now; the settled are forgotten."""
        settled = self.settled
        since = self.since
        under = [
            link
            for link in settled
            if (link.unsettled - since[link]) * UNSETTLED_DELIVERY_COST < share
        ]
        settled.clear()
        return under

    def let_go(self) -> list[OutgoingLink]:
        """The budget let go: growth is forgotten; the links held, for their sessions to let go."""
        self.blocked = False
        self.since.clear()
        self.settled.clear()
        return list(self.held)

    def forget(self, link: OutgoingLink) -> None:
        """``link`` detached: nothing here names it."""
        self.since.pop(link, None)
        self.held.pop(link, None)
        self.settled.pop(link, None)
