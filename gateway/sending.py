"""The hot pump: what the queues hand consumers goes to proton, session by session.

A store or a settlement hands deliveries to consumers' pure links (``route``); their sessions
are marked and pumped together when the reactor runs out of events (``pump_marked``), so one
socket read of many messages costs one pass over each session's ``outgoing_pending``. Payload
buffers of unsettled deliveries go back to proton's pool once framed
(gateway/proton/payload_buffers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from sluicegate.gateway.proton import deliveries, payload_buffers
from sluicegate.gateway.proton.drain import send_drained_flow
from sluicegate.gateway.proton.internals import c_object
from sluicegate.gateway.state import ConnectionState, OutgoingLinkState, SessionState
from sluicegate.queues.message import Imported, Message
from sluicegate.queues.queue_type import ConsumerKey, CreditReply, Dispatch
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.outbound import (
    LinkFlow,
    Session,
    TransferPart,
    apply_hold,
    budget_flushed,
    resume,
    route,
)
from sluicegate.session.outgoing_link import LinkOwner, OutgoingLink
from sluicegate.session.unsettled import UNSETTLED_DELIVERY_COST, Unsettled
from sluicegate.session.waiting import WaitingBytes
from sluicegate.writer.writer import ServerBytes


class Sending:
    """Every session's outbound deliveries and FLOWs, and what the server holds for them."""

    def __init__(self, held_for_peers: Callable[[], int]) -> None:
        # Sessions with something new to send since the last pump.
        self._dirty: set[SessionState] = set()
        # Connections with unsettled deliveries whose payload buffers are to be given back.
        self._unframed: set[ConnectionState] = set()
        # Each live session's record, by its pure session (what ``route`` names).
        self._states: dict[LinkOwner, SessionState] = {}
        # Bytes every connection's writer handed to proton and that are not written yet.
        self.pending_bytes = ServerBytes()
        # Unsettled deliveries to consumers, over every session.
        self.unsettled = Unsettled()
        # What deliveries waiting in every connection's sessions hold (session/waiting.py).
        self.waiting = WaitingBytes()
        # What the worker holds for other workers' consumers (gateway/peers.py).
        self.held_for_peers = held_for_peers

    def begin(self, state: SessionState) -> None:
        """A new session: the queues' dispatches may name it from now on."""
        self._states[state.pure] = state

    def route(self, dispatches: list[Dispatch]) -> None:
        states = self._states
        for pure in route(dispatches):
            # A remote consumer's outbox (session/channel/owner.py) is no session: the
            # channel frames what it gathered at its own flush (gateway/peers.py).
            state = states.get(pure)
            if state is not None:
                self._dirty.add(state)

    def delivered(self, link: OutgoingLink, messages: list[Message]) -> None:
        """Another worker's queue sent a consumer a run of deliveries (gateway/peers.py)."""
        if not link.detached:
            session = cast(Session, link.session)
            session.deliver_all(link, messages)
            self._dirty.add(self._states[session])

    def replied(self, link: OutgoingLink, reply: CreditReply) -> None:
        """Another worker's queue answered a consumer's credit request (gateway/peers.py)."""
        if not link.detached:
            session = cast(Session, link.session)
            session.credit_replied(link, reply)
            self._dirty.add(self._states[session])

    def shorted(self, link: OutgoingLink, size: int) -> None:
        """Another worker's queue holds back a consumer's deliveries past what it reserved
        (gateway/peers.py)."""
        if not link.detached:
            session = cast(Session, link.session)
            session.shorted(link, size)
            self._dirty.add(self._states[session])

    def sender_of(self, link: OutgoingLink) -> OutgoingLinkState | None:
        """A consumer's link record, if its session still lives."""
        state = self._states.get(link.session)
        return None if state is None else state.senders.get(link)

    def resume(self, connection: ConnectionState) -> None:
        """Once enough has left a connection's sessions, make its deferred credit requests."""
        if connection.waiting.resumable and not connection.closed:
            states = self._states
            for pure in resume(connection.waiting):
                self._dirty.add(states[pure])

    def budget_blocked(self, blocked: bool, full: bool, import_room: int) -> None:
        """The memory budget as this flush left it: which requests to another worker's queue
        may go, which are made now and which credit is taken back (session/waiting.py)."""
        states = self._states
        for pure in budget_flushed(self.waiting, blocked, full, import_room):
            state = states.get(pure)
            if state is not None:
                self._dirty.add(state)

    def hold(self, debt: DeadLetterDebt) -> None:
        """A connection's dead-letter debt changed whom it holds: hold or let go its links
        (session/dead_letter_debt.py) and pump their sessions, whose queues answer at once."""
        states = self._states
        for pure in apply_hold(debt):
            state = states.get(pure)
            if state is not None:
                self._dirty.add(state)

    def hold_unsettled(self, held: list[OutgoingLink], let_go: list[OutgoingLink]) -> None:
        """The blocked budget holds, or lets go, consumer links for the deliveries they took
        unsettled since it blocked (session/unsettled.py); their sessions are pumped."""
        for link in held:
            cast(Session, link.session).hold_unsettled(link)
        for link in let_go:
            cast(Session, link.session).release_unsettled(link)
        states = self._states
        for link in (*held, *let_go):
            state = states.get(cast(Session, link.session))
            if state is not None:
                self._dirty.add(state)

    def debt_of(self, link: ConsumerKey) -> DeadLetterDebt | None:
        """The dead-letter debt of a consumer's connection, while its session lives: what the
        letters its outcomes make on another worker are charged to (gateway/peers.py)."""
        state = self._states.get(cast(OutgoingLink, link).session)
        return None if state is None else state.connection.letters

    def mark(self, session: SessionState) -> None:
        """Have a session pumped at the next flush."""
        self._dirty.add(session)

    def outbound_bytes(self) -> int:
        """What consumers make the server hold beyond the queued messages: deliveries waiting in
        sessions, bytes handed to proton and not yet written, and the bookkeeping of unsettled
        deliveries."""
        return (
            self.waiting.total
            + self.waiting.reserved
            + self.pending_bytes.total
            + self.unsettled.count * UNSETTLED_DELIVERY_COST
            + self.held_for_peers()
        )

    def pump_marked(self) -> None:
        """Pump every session that has something new to send; give back framed buffers."""
        dirty = self._dirty
        while dirty:
            state = dirty.pop()
            self.pump(state)
            self.resume(state.connection)
        if self._unframed:
            self.give_back_buffers()

    def pooled(self, connection: ConnectionState, held: int) -> None:
        """An END or a DETACH released what the server held beyond ``held`` (read before it):
        proton keeps the structs of the freed deliveries in a pool for its connection's life,
        and the most one release freed is trimmed when the connection goes."""
        connection.pooled = max(connection.pooled, held - self.outbound_bytes())

    def released(self, connection: ConnectionState) -> None:
        """A connection ended: the buffers of what it sent go back now, not at a later pump."""
        if connection in self._unframed:
            self.give_back_buffers()

    def forget(self, state: SessionState) -> None:
        """An ended session: nothing of it is pumped any more."""
        self._dirty.discard(state)
        del self._states[state.pure]

    def give_back_buffers(self) -> None:
        """Free the payload buffers of unsettled deliveries proton has framed since.

        Proton frames what it may send when asked for its output; a delivery still waiting
        for the client's window is looked at again after the next pump.
        """
        for connection in list(self._unframed):
            framing = not connection.closed
            if framing:
                connection.transport.pending()
            connection.unframed = payload_buffers.give_back(
                connection.unframed, connection.sent, framing
            )
            connection.sent = []
            if not connection.unframed:
                self._unframed.discard(connection)

    def pump(self, state: SessionState) -> None:
        """Hand the session's sendable deliveries and FLOWs to proton."""
        if state.connection.closed:
            return
        state.refresh_window()
        senders = state.senders
        # proton's C calls per message, bound once a pump (gateway/proton/deliveries.py): a function
        # of our own around them cost as much again as the calls.
        new_delivery = deliveries.new_delivery
        write = deliveries.write
        advance = deliveries.advance
        settle = deliveries.settle
        from_buffer = deliveries.from_buffer
        keep = payload_buffers.KEEP
        sent = state.connection.sent
        # Whole deliveries come in runs of one link: its sender and settle mode are looked up
        # once a run, and the transport is told of the run's deliveries at its end.
        link: OutgoingLink | None = None
        sender = None
        ack = False
        run = 0
        try:
            for action in state.pure.send_pending():
                if type(action) is tuple:
                    if action[0] is not link:
                        if run and link is not None:
                            link.transport_sent(run)
                            run = 0
                        link = action[0]
                        sender = c_object(senders[link].sender)
                        ack = link.ack_required
                    message = action[1]
                    # A plain message's bytes are its payload unless its returns changed
                    # what is stamped on them (queues/message.py), and another worker's delivery
                    # is its payload; a stored one reads them.
                    payload = (
                        message.payload
                        if (
                            type(message) is Message
                            and message.delivery_count == message.stamped
                            and not message.counts
                        )
                        or type(message) is Imported
                        else message.send()
                    )
                    tag = b"%d" % message.seq
                    delivery = new_delivery(sender, (len(tag), from_buffer(tag)))
                    # cffi passes bytes to a char * as they are; other buffers need a view.
                    write(
                        sender,
                        payload if type(payload) is bytes else from_buffer(payload),
                        len(payload),
                    )
                    advance(sender)
                    run += 1
                    if not ack:
                        settle(delivery)
                    elif len(payload) > keep:
                        sent.append(delivery)
                    continue
                if run and link is not None:
                    link.transport_sent(run)
                    run = 0
                if type(action) is TransferPart:
                    self._send_part(senders[action.link], action)
                else:
                    assert isinstance(action, LinkFlow)
                    self._send_link_flow(senders.get(action.link), action)
        finally:
            if run and link is not None:
                link.transport_sent(run)
            if sent:
                self._unframed.add(state.connection)

    def _send_part(self, state: OutgoingLinkState, part: TransferPart) -> None:
        """Stream part of a delivery; proton sends it as TRANSFERs with more=true until the last."""
        sender = state.sender
        message = part.message
        if part.start == 0:
            sender.delivery(str(message.seq))
        sender.stream(message.read()[part.start : part.end])
        if part.end == message.read_size():
            delivery = sender.current
            assert delivery is not None
            sender.advance()
            part.link.transport_sent()
            if not part.link.ack_required:
                delivery.settle()
            else:
                # Its buffer goes back once proton has framed it (an unsettled delivery lives
                # until the client settles it: gateway/proton/payload_buffers.py).
                state.session.connection.sent.append(c_object(delivery))

    def _send_link_flow(self, state: OutgoingLinkState | None, flow: LinkFlow) -> None:
        """Send a drain completion; proton can send no other FLOW for a sending link."""
        if state is None or not flow.drain:
            return
        state.drain_pending = flow
        self.complete_drain(state)

    def complete_drain(self, state: OutgoingLinkState) -> None:
        """Let proton send the drained FLOW once it holds no transfer of the link.

        Proton drops the drained FLOW if told while transfers still wait inside it (for the
        window, say); it must come after them anyway (AMQP 1.0 §2.6.7). When the transfers
        used up all the credit, ``drained()`` sends nothing and ``send_drained_flow`` does.
        """
        sender = state.sender
        if sender.queued:
            return
        state.drain_pending = None
        state.link.transport_drained(sender.drained() or send_drained_flow(sender))
