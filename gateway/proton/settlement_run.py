"""A consumer's settlements of one outcome, gathered over consecutive delivery events and
applied to its queue in one call.

A client settling a range of deliveries sends one DISPOSITION (first..last), and proton raises
one delivery event for each delivery in it: the Spark connector's ``mode=queue`` accepts
100,000 at a time. Taken one by one, each delivery looked its link's state up, went through
the session and the queue with a list of one, and logged its settlement alone. A run keeps the
sequence numbers of consecutive events of one link with one outcome that has no fields of its
own (accepted, released, rejected); the broker hands them to the session at once when an event
of anything else comes, and before any other event is dispatched (``gateway/proton/reactor.py``), so
every other handler (a detach, a closed connection, a FLOW, the flush that pumps sessions)
sees the settlements applied, as it did when they were applied one at a time.

The run holds plain sequence numbers, no proton objects: each delivery is settled in proton
as its event is handled, as before. It holds at most the deliveries of one link, which the
client has settled and which its session counts as unsettled until the run is applied.
"""

from __future__ import annotations

from typing import Any, Final

from cproton import (
    PN_DELIVERY,
    ffi,
    lib,
    pn_collector_peek,
    pn_collector_pop,
    pn_delivery_link,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_event_delivery,
    pn_event_type,
)

from sluicegate.gateway.state import OutgoingLinkState
from sluicegate.queues.queue_type import Outcome

_NULL: Final = ffi.NULL
# The run's outcome code when its deliveries were settled with none (which counts as accepted):
# no code proton reports, so each such delivery takes the full path, which checks it is settled.
NO_OUTCOME: Final = -1


class SettlementRun:
    """Sequence numbers a consumer link's deliveries were settled with, one outcome, in order."""

    __slots__ = ("link", "outcome", "remote", "seqs", "state")

    def __init__(self) -> None:
        # The run's ``pn_link_t *``: an event of the same link continues the run, known
        # without looking its state up. A link lives at least as long as the run: nothing
        # frees one between two delivery events.
        self.link: Any = _NULL
        self.state: OutgoingLinkState | None = None
        self.outcome = Outcome.ACCEPTED
        # Proton's code of the outcome the run's deliveries came with: a delivery of the link
        # with the same code joins the run at once.
        self.remote = NO_OUTCOME
        self.seqs: list[int] = []

    def start(self, link: Any, state: OutgoingLinkState, outcome: Outcome, remote: int) -> None:
        """A new run, of ``state``'s link (``link``, proton's) with ``outcome`` (proton's code
        ``remote``, or :data:`NO_OUTCOME`)."""
        self.link = link
        self.state = state
        self.outcome = outcome
        self.remote = remote

    def extend(self, collector: Any) -> None:
        """Take the events waiting in proton's ``collector`` (a ``pn_collector_t *``) that
        continue the run: deliveries of its link settled with its outcome, each settled in
        proton and popped. It stops at the first other event, left for the reactor.

        A client settling 100,000 deliveries in one DISPOSITION makes 100,000 such events in a
        row: here each costs its calls into proton and no call of ours (the tag is read as
        ``gateway/proton/deliveries.py``'s ``tag_number`` reads it).
        """
        link, remote, append = self.link, self.remote, self.seqs.append
        # cproton's own ``pn_delivery_tag`` converts the tag to Python; the C one does not.
        unpack, tag_of = ffi.unpack, lib.pn_delivery_tag
        while (event := pn_collector_peek(collector)) != _NULL and pn_event_type(
            event
        ) == PN_DELIVERY:
            delivery = pn_event_delivery(event)
            if pn_delivery_link(delivery) != link or pn_delivery_remote_state(delivery) != remote:
                return
            tag = tag_of(delivery)
            append(int(unpack(tag.start, tag.size)))
            pn_delivery_settle(delivery)
            pn_collector_pop(collector)

    def take(self) -> tuple[OutgoingLinkState, Outcome, list[int]] | None:
        """What the run gathered, which ends it; None if nothing."""
        state, seqs = self.state, self.seqs
        if not seqs or state is None:
            return None
        self.link = _NULL
        self.state = None
        self.seqs = []
        return state, self.outcome, seqs
