"""Transfers from clients: a publisher's message, a consumer's settlement, a management request.

Consumers' settlements gather in runs (gateway/proton/settlement_run.py), which the reactor
takes whole and has applied before it dispatches any other event; a ``modified`` outcome, with
fields of its own, is applied alone. A publisher's transfer goes to gateway/publishing.py.

The dead letters a consumer's settlements make are charged to its link, against its
connection's dead-letter debt: at the debt's limit the links that made them get no new
deliveries, while the connection is still read, so that its settlements go on freeing the
budget the letters wait for (session/dead_letter_debt.py, docs/outbound-flow-control.md).
"""

from __future__ import annotations

from typing import Final

from proton import Disposition

from sluicegate.gateway.links import Links
from sluicegate.gateway.management.node import ManagementNode
from sluicegate.gateway.proton import deliveries, payload_buffers
from sluicegate.gateway.proton.deliveries import CDelivery
from sluicegate.gateway.proton.settlement_run import NO_OUTCOME, SettlementRun
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.rules.modified_outcomes import ModifiedAnnotations
from sluicegate.gateway.sending import Sending
from sluicegate.gateway.state import IncomingLinkState, OutgoingLinkState
from sluicegate.queues.dead_lettering import DeadLetterRouter
from sluicegate.queues.queue_type import LockExpired, Outcome
from sluicegate.wire.annotations import InvalidAnnotations

_OUTCOMES: Final[dict[int, Outcome]] = {
    Disposition.ACCEPTED: Outcome.ACCEPTED,
    Disposition.RELEASED: Outcome.RELEASED,
    Disposition.REJECTED: Outcome.REJECTED,
    Disposition.MODIFIED: Outcome.MODIFIED,
}


class Settling:
    """Every delivery a client sends the server, routed by its link."""

    def __init__(
        self,
        publishing: Publishing,
        links: Links,
        sending: Sending,
        management: ManagementNode,
        modified_annotations: ModifiedAnnotations,
    ) -> None:
        self._publishing = publishing
        self._links = links
        self._dispatch = sending.route
        self._sending = sending
        self._management = management
        # The annotations of consumers' modified outcomes, checked once per range.
        self._modified_annotations = modified_annotations
        # Consecutive settlements of one consumer link, applied together.
        self.settlements = SettlementRun()

    def on_delivery_of(self, delivery: CDelivery) -> None:
        """The delivery event's work, called by the reactor with proton's bare delivery.

        Consumers' settlements gather in :attr:`settlements` (``gateway/proton/settlement_run.py``),
        which takes the events that continue its run itself; the reactor has them applied
        before it dispatches any other event.
        """
        run = self.settlements
        if run.seqs and deliveries.link(delivery) == run.link:
            assert run.state is not None
            self._settled(run.state, delivery)
            return
        state = deliveries.link_state(delivery)
        if type(state) is OutgoingLinkState:
            self._settled(state, delivery)
            return
        self.apply_settlements()
        if not deliveries.readable(delivery):
            # A transfer's event is for the delivery its link is receiving. Any other updates
            # one received before: a publisher settling or stating what it sent, as a sender
            # may (AMQP 1.0 §2.6.12), while its copies wait to be stored, or more frames of a
            # delivery refused before its end; a consumer's settlements went to
            # ``_settled``. Taken for a transfer, each was stored as a message of no bytes and
            # advanced the link past the delivery it was receiving (found following adversary
            # seed 66159's abort, tests/integration/test_publisher_settles_first.py).
            if payload_buffers.settled_here(delivery) and deliveries.on_receiver(delivery):
                # Proton goes on buffering a refused delivery's frames: dropped as they come
                # (Publishing.discard).
                payload_buffers.drop(delivery)
            return
        if type(state) is IncomingLinkState:
            self._publishing.receive(state, delivery)
        elif state is None:
            # A link refused at attach or detached since: what still arrives is dropped.
            if deliveries.on_receiver(delivery):
                self._publishing.discard(delivery)
        else:
            # The management node's.
            wrapped = deliveries.wrap(delivery)
            link = wrapped.link
            if link.is_receiver:
                self._management.on_request(link, wrapped)
                if payload_buffers.settled_here(delivery):
                    # Answered, or refused before its end: what proton still buffers of it (or
                    # goes on buffering, as Publishing.discard says) is dropped.
                    payload_buffers.drop(delivery)

    def _settled(self, state: OutgoingLinkState, delivery: CDelivery) -> None:
        remote = deliveries.remote_state(delivery)
        outcome = _OUTCOMES.get(remote)
        if outcome is None:
            if not deliveries.settled(delivery):
                return
            outcome = Outcome.ACCEPTED
            remote = NO_OUTCOME
        run = self.settlements
        if outcome is Outcome.MODIFIED:
            self.apply_settlements()
            self._modified(state, delivery)
            return
        if run.state is not state or run.outcome is not outcome:
            self.apply_settlements()
            run.start(deliveries.link(delivery), state, outcome, remote)
        run.seqs.append(deliveries.tag_number(delivery))
        deliveries.settle(delivery)

    def apply_settlements(self) -> None:
        """Hand the run of settlements gathered so far to its session and queue."""
        taken = self.settlements.take()
        if taken is None:
            return
        state, outcome, seqs = taken
        router = self._router(state)
        since = len(router.outbox)
        try:
            dispatches = state.session.pure.settle(state.link, seqs, outcome, False)
        except LockExpired as error:
            self._lock_expired(state, error)
            return
        finally:
            self._blame(state, router, since)
        if dispatches:
            self._dispatch(dispatches)

    def _modified(self, state: OutgoingLinkState, delivery: CDelivery) -> None:
        """A ``modified`` outcome, with its own fields: applied alone."""
        router = self._router(state)
        since = len(router.outbox)
        try:
            dispatches = state.session.pure.settle(
                state.link,
                [deliveries.tag_number(delivery)],
                Outcome.MODIFIED,
                deliveries.remote_failed(delivery),
                undeliverable_here=deliveries.remote_undeliverable(delivery),
                annotations=self._modified_annotations.checked(
                    deliveries.remote_annotations(delivery)
                ),
            )
        except InvalidAnnotations as error:
            # Nothing was settled: the message goes back when the link detaches. Proton lets
            # go of the delivery and its copy of the annotations.
            deliveries.settle(delivery)
            self._links.refuse(state.sender, error)
            return
        except LockExpired as error:
            deliveries.settle(delivery)
            self._lock_expired(state, error)
            return
        finally:
            self._blame(state, router, since)
        deliveries.settle(delivery)
        if dispatches:
            self._dispatch(dispatches)

    @staticmethod
    def _router(state: OutgoingLinkState) -> DeadLetterRouter:
        """Where the settlements of ``state``'s consumer put the letters they make."""
        vhost = state.session.connection.vhost
        assert vhost is not None
        return vhost.registry.dead_letter_router

    def _blame(self, state: OutgoingLinkState, router: DeadLetterRouter, since: int) -> None:
        """Charge the letters a settlement put in the outbox from ``since`` on to its link."""
        if len(router.outbox) > since:
            letters = state.session.connection.letters
            if router.blame(since, letters.cause(state.link)):
                self._sending.hold(letters)

    def _lock_expired(self, state: OutgoingLinkState, error: LockExpired) -> None:
        """A settlement came after a delivery's lock expired: the message went back then, the
        late settlement changed nothing, and the consumer learns why (RabbitMQ closes on its
        consumer timeout too)."""
        self._dispatch(error.dispatches)
        self._links.refuse(state.sender, error)
