"""The outbound half of an AMQP session: ``outgoing_pending`` and the credit top-up (PR 11307).

Deliveries from queues and the queues' credit replies wait in one FIFO, ``outgoing_pending``.
:meth:`Session.send_pending` walks it after every event: a credit reply is handled when it
reaches the head, that is only once every delivery queued before it has been handed to the
writer, so the next batch of queue credit is requested only when the previous batch has left
the session; a queue of another worker, whose batch comes a round trip after the request, is
asked while the last quarter of its batch waits (``credit_replied``). Deliveries wait while the
client's remote incoming window is closed or the writer has blocked the session; FLOWs never
wait (AMQP 1.0 §2.5.6, docs/outbound-flow-control.md).

A message is never handed over in more frames than the window and the writer's credit both
allow: one that needs more goes out as a :class:`TransferPart` of as many frames as they allow,
and the rest stays at the head of ``outgoing_pending`` until the window reopens or the writer
gives credit back (RabbitMQ keeps the remaining frames at the head the same way). Handing proton
the whole message would be safe on the wire (proton applies the window frame by frame) but would
leave its remaining frames buffered inside proton, out of the writer's count.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final, TypeAlias, cast

from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    ConsumerOptions,
    CreditReply,
    Dispatch,
    Outcome,
    QueueType,
)
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.outgoing_link import CreditReq, LinkOwner, OutgoingLink
from sluicegate.session.unsettled import Unsettled
from sluicegate.session.waiting import (
    IMPORT_BATCH,
    WAITING_DELIVERY_COST,
    Waiting,
    WaitingBytes,
    import_unit,
)
from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd, serial_add, serial_diff
from sluicegate.writer.credit import SessionCredit
from sluicegate.writer.writer import Writer

# RabbitMQ's DEFAULT_MAX_QUEUE_CREDIT: the largest batch a queue holds per consumer, so at most
# this many deliveries per consumer wait in outgoing_pending.
DEFAULT_MAX_QUEUE_CREDIT: Final = 256
# A consumer of a queue that answers a round trip later (another worker's) asks for the next
# batch once its queue's credit is under this fraction of a batch: a quarter of 256 is 64
# deliveries, some 1.3 ms of a client taking 50,000 a second, against a round trip between
# workers of a tenth of that. Half asked twice as often (each request then brings only what
# the half that left makes room for), and each request costs both workers a reactor pass:
# measured with strace, 23 passes per 1,000 messages over the two workers at half, 17 at a
# quarter, 14 asking at none (docs/outbound-flow-control.md#a-queue-that-answers-later).
TOP_UP_FRACTION: Final = 4
# A batch of another worker's queue may hold this many of a local queue's (``max_queue_credit``)
# when the client's credit allows, still within ``IMPORT_BATCH`` bytes: every batch costs both
# workers a reactor pass a local batch does not (the request, the owner's answer, the read), and
# at 256 a window of 1,000 credit took four round trips. Four local batches of 100-byte messages
# are some 100 KiB, under the quarter MiB a batch may bring; larger messages are held to that
# quarter MiB as before. Measured with strace, the owner's passes per 1,000 messages crossing
# went from 4.7 to 1.5 and the consumer's worker's from 7.4 to 5.4 (docs/workers.md).
IMPORT_CREDIT_FACTOR: Final = 4
# Bytes a TRANSFER frame adds around its payload: 8 bytes of frame header and a performative
# (handle, delivery-id, tag, format, settled, more) that stays under 56 bytes for 8-byte tags.
TRANSFER_FRAME_OVERHEAD: Final = 64
# AMQP 1.0 §2.7.1: the smallest max-frame-size a peer may announce.
MIN_MAX_FRAME_SIZE: Final = 512


@dataclass(frozen=True, slots=True)
class LinkFlow:
    """A FLOW the session sends for a consumer link (a drain completion or an echo)."""

    link: OutgoingLink
    delivery_count: int
    link_credit: int
    available: int
    drain: bool
    # The credit a drain completion advanced the delivery-count by: taken back if the FLOW
    # is never sent (:meth:`OutgoingLink.drain_withdrawn`).
    drained: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class TransferPart:
    """Payload bytes ``start:end`` of a delivery spanning more frames than may go out now.

    Parts of one message come in order with nothing in between; the delivery is complete with
    the part whose ``end`` is the payload's length.
    """

    link: OutgoingLink
    message: Message
    start: int
    end: int


# What send_pending hands to the IO layer, in wire order: a TRANSFER of a whole message, part
# of one, or a FLOW.
Transfer: TypeAlias = tuple[OutgoingLink, Message]
Action: TypeAlias = Transfer | TransferPart | LinkFlow
_Pending: TypeAlias = tuple[OutgoingLink, Message | CreditReply | LinkFlow]


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """The session's outbound flow-control state for metrics and tests."""

    outgoing_pending: int
    pending_deliveries: int
    remote_incoming_window: int
    writer_blocked: bool
    writer_credit: int
    credit_requests_in_flight: int
    stashed_credit_reqs: int
    links: int
    # What its waiting deliveries are charged to its connection (session/waiting.py).
    pending_bytes: int = 0


class Session:
    """Outbound flow control of one AMQP session, free of IO: events in, actions out."""

    def __init__(
        self,
        writer: Writer,
        *,
        max_queue_credit: int = DEFAULT_MAX_QUEUE_CREDIT,
        max_import_credit: int | None = None,
        max_frame_size: int = 65536,
        remote_incoming_window: int = 0,
        unsettled: Unsettled | None = None,
        waiting: Waiting | None = None,
    ) -> None:
        if max_queue_credit <= 0:
            raise ValueError("max_queue_credit must be positive")
        self.writer = writer
        self.writer_credit: SessionCredit = writer.session_credit()
        self.max_queue_credit = max_queue_credit
        # The largest batch asked of another worker's queue (the gateway's is
        # IMPORT_CREDIT_FACTOR times max_queue_credit; by default the same as a local one's).
        self.max_import_credit = (
            max_queue_credit if max_import_credit is None else max_import_credit
        )
        self.frame_payload = max(max_frame_size, MIN_MAX_FRAME_SIZE) - TRANSFER_FRAME_OVERHEAD
        self.remote_incoming_window = remote_incoming_window
        self.outgoing_pending: deque[_Pending] = deque()
        # Payload bytes of the message at the head of outgoing_pending already handed over.
        self.head_sent = 0
        # Whether a credit reply joined outgoing_pending, or a link's deliveries were given
        # back, since the last :meth:`_bypass`: only then may one find a reply to hand out.
        # Walked at every read while the client's window stayed shut, 31,000 waiting entries
        # cost each empty frame of the client's 3-5 ms of the reactor.
        self._bypass_due = False
        self.links: dict[int, OutgoingLink] = {}
        # Shared with the server's other sessions (the memory budget reads the count).
        self.unsettled = Unsettled() if unsettled is None else unsettled
        # Shared with the connection's other sessions: what their waiting deliveries hold.
        self.waiting = Waiting() if waiting is None else waiting
        # This session's part of it, and of that what the server's count has not from the
        # queues already (session/waiting.py ``charge``).
        self.pending_bytes = 0
        self.pending_server = 0
        # Links of queues that answer later whose batch ran low during this send_pending: asked
        # once it ends, when what it could send has left (:meth:`_top_up`).
        self.top_ups: dict[OutgoingLink, None] = {}
        # Of pending_bytes, what other workers' deliveries hold (the budget's imports' part).
        self.pending_imported = 0
        # Its links that gave back what they held while their client read nothing (:meth:`stall`).
        self.stalled_links: dict[OutgoingLink, None] = {}

    # -- links ----------------------------------------------------------------------------

    def attach_link(
        self,
        handle: int,
        queue: QueueType,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> OutgoingLink:
        """Register a consumer link; it gets nothing until the client's first FLOW."""
        link = OutgoingLink(self, handle, queue, ack_required)
        if getattr(queue, "answers_later", False):
            # Its batch crosses a round trip after the request: asked for once most of the
            # last has left, the next is on its way while the rest is sent
            # (docs/outbound-flow-control.md#a-queue-that-answers-later).
            link.batch = self.max_import_credit
            link.top_up_below = max(1, link.batch // TOP_UP_FRACTION)
            link.imports = True
        else:
            link.batch = self.max_queue_credit
        held = getattr(queue, "held", None)
        if getattr(queue, "counts_unacked", False) and held is not None:
            if options.browse:
                # What it sees stays in its queue, whose copy counts the payload: each waiting
                # delivery is a copy that shares it, counted until sent (adversary seed 64201:
                # a browser's deliveries counted again made the budget 85 MB of 75.5 MB).
                link.shares = held
                link.browse = link.counted = True
            elif not ack_required:
                # Its messages leave their queue as they are handed out, but a fan-out's other
                # queues may still count their payload: each waiting one is counted as one more
                # holder of it until sent (adversary seed 64301: 7.5 MB counted twice).
                link.shares = held
        # What ``deliver`` and ``ask_queue`` may charge in full: a pre-settled consumer's
        # stored messages come with their bodies read for it, not shared (a durable queue's).
        link.uncounted = not (
            link.imports or link.counted or getattr(queue, "passes_through", False)
        )
        self.links[handle] = link
        queue.attach(link, ack_required=ack_required, options=options)
        return link

    def detach_link(self, link: OutgoingLink) -> list[Dispatch]:
        """Forget a link: its buffered deliveries are dropped here and given back to the queue."""
        if link.detached:
            return []
        link.detached = True
        self.links.pop(link.handle, None)
        self.unsettled.count -= link.unsettled
        self.unsettled.forget(link)
        link.unsettled = 0
        if self.outgoing_pending and self.outgoing_pending[0][0] is link:
            # A message of this link partly handed over: the client never gets all of it.
            self.head_sent = 0
        # Its entries stay in outgoing_pending, dropped as they come up (send_pending, _bypass):
        # taking them out here cost a walk over every link's entries per DETACH.
        unsent = list(link.waiting)
        link.waiting.clear()
        self.waiting.forget(link)
        server = self.waiting.server
        if link.uncounted:
            server.uncounted.pop(link, None)
        if link.reserved:
            server.reserve(link, 0)
        if link.imports:
            server.holding.pop(link, None)
            server.stalled.pop(link, None)
            self.stalled_links.pop(link, None)
        if unsent:
            held = sum(m.held for m in unsent)
            shares = link.shares
            if shares is not None:
                shared = [m for m in unsent if type(m) is Message]
                counted = held if link.counted else sum(m.held for m in shared)
                # Before their queue takes back what it archived as it handed them out.
                shares.let_go_all(shared)
            else:
                counted = held if link.counted else 0
            cost = held + len(unsent) * WAITING_DELIVERY_COST
            self._uncharge(cost, counted, cost if link.imports else 0)
        return link.queue.detach(link, unsent)

    def end(self) -> list[Dispatch]:
        """The session ended: every link is detached and its messages go back to their queues."""
        dispatches: list[Dispatch] = []
        for link in list(self.links.values()):
            dispatches.extend(self.detach_link(link))
        self.outgoing_pending.clear()
        self._uncharge_all()
        self.writer.forget(self.writer_credit)
        return dispatches

    def hold(self, link: OutgoingLink) -> None:
        """Its connection's dead-letter debt holds the link (session/dead_letter_debt.py): no
        new credit reaches its queue, and what the queue holds is taken back, by a request
        for none now or, with one out, when its reply comes. What the session holds for it
        already still goes out, at most one batch."""
        link.debt_held = True
        self._hold(link)

    def release(self, link: OutgoingLink) -> None:
        """The debt is back at half its limit: the link asks for the credit its client
        granted again, unless it is stalled too."""
        link.debt_held = False
        if not (link.stalled or link.unsettled_held):
            self._ask_again(link)

    def stall(self, link: OutgoingLink) -> None:
        """Another worker's consumer whose client reads nothing now (its window or its writer
        is closed) while others wait for the imports' part (session/waiting.py): held as for
        a debt, and once its queue's reply says it holds no credit, what the session holds
        for it unsent goes back to its queue (:meth:`_give_back`), so that a client that does
        not read holds none of the part. It asks again once its session can hand something
        out, or the budget lets go (:meth:`unstall`)."""
        link.stalled = True
        self.stalled_links[link] = None
        self.waiting.server.stalled[link] = None
        self._hold(link)
        if not link.credit_req_in_flight:
            # The queue may hold no credit already: a request for none says so all the same.
            self._request_credit(link, 0, False)

    def unstall(self, link: OutgoingLink) -> None:
        """The link's client may read again: it asks for the credit its client granted."""
        link.stalled = False
        self.stalled_links.pop(link, None)
        self.waiting.server.stalled.pop(link, None)
        if not (link.debt_held or link.unsettled_held):
            self._ask_again(link)

    def hold_unsettled(self, link: OutgoingLink) -> None:
        """The blocked budget holds the link for the unsettled deliveries it took since it
        blocked (session/unsettled.py): held as for a debt."""
        self.unsettled.hold(link)
        self._hold(link)

    def release_unsettled(self, link: OutgoingLink) -> None:
        """It settled back under its share, or the budget let go: it asks for the credit its
        client granted again, unless held for another reason."""
        self.unsettled.release(link)
        if not (link.debt_held or link.stalled):
            self._ask_again(link)

    def _hold(self, link: OutgoingLink) -> None:
        link.held = True
        drain = self.waiting.forget(link)
        if drain is not None:
            self.ask_queue(link, drain)
        elif not link.credit_req_in_flight and link.queue_flow_ctl.credit > 0:
            self._request_credit(link, 0, False)

    def _ask_again(self, link: OutgoingLink) -> None:
        link.held = False
        client = link.client_flow_ctl
        if not link.credit_req_in_flight and client.credit > 0 and not link.detached:
            self._request_credit(link, min(client.credit, link.batch), link.queue_flow_ctl.drain)

    @property
    def can_hand_out(self) -> bool:
        """Whether a delivery could leave now: the client's window and the writer are open."""
        return (
            self.remote_incoming_window > 0
            and self.writer_credit.credit > 0
            and self.writer.room > 0
        )

    def _give_back(self, link: OutgoingLink) -> None:
        """Hand the stalled link's unsent deliveries back to its queue (QueueType.give_back),
        all but one the client has part of: they count as having left the session, so the
        queue's credit is counted as before, and their bytes leave the imports' part."""
        waiting = link.waiting
        head = self.outgoing_pending[0] if self.outgoing_pending else None
        kept = head if head is not None and head[0] is link and self.head_sent else None
        unsent = list(waiting)
        if kept is not None:
            unsent = unsent[1:]
        if not unsent:
            return
        # Their entries stay in outgoing_pending, dropped as they come up (``stale``): a walk
        # over every entry per link given back would be the attacker's to repeat.
        link.stale += len(unsent)
        self._bypass_due = True
        self.waiting.server.given_back += len(unsent)
        waiting.clear()
        if kept is not None:
            waiting.append(cast(Message, kept[1]))
        else:
            self.waiting.server.holding.pop(link, None)
        held = sum(m.held for m in unsent)
        cost = held + len(unsent) * WAITING_DELIVERY_COST
        self._uncharge(cost, held if link.counted else 0, cost)
        queue_ctl = link.queue_flow_ctl
        queue_ctl.delivery_count = (queue_ctl.delivery_count + len(unsent)) & SERIAL_MASK
        link.queue.give_back(link, unsent)

    # -- events from the client -----------------------------------------------------------

    def client_flow(
        self, link: OutgoingLink, delivery_count: int, link_credit: int, drain: bool, echo: bool
    ) -> None:
        """A client FLOW for a consumer link: request credit, or stash it (RabbitMQ's
        handle_outgoing_link_flow_control)."""
        if link.credit_req_in_flight:
            if not (drain and self._starved(link)):
                link.stashed_credit_req = CreditReq(delivery_count, link_credit, drain, echo)
                return
            # Its request waits for the budget: the drain replaces it, and any FLOW stashed
            # before it, and is answered now (a stale stash popped after its reply did not).
            self.waiting.forget(link)
            link.credit_req_in_flight = False
            link.stashed_credit_req = None
        client = link.client_flow_ctl
        desired = link_credit_snd(delivery_count, link_credit, client.delivery_count)
        client.credit = desired
        client.echo = echo
        link.queue_flow_ctl.drain = drain
        self._request_credit(link, min(desired, link.batch), drain)

    def transport_flow(self, link: OutgoingLink, credit: int, drain: bool, unsettled: int) -> bool:
        """What the transport shows of a consumer link after a flow event: its credit, drain
        flag and unsettled deliveries. True if that was a client FLOW, which the session then
        acts on (see :meth:`OutgoingLink.flow_seen`)."""
        granted = link.flow_seen(credit, drain, unsettled)
        if granted is None:
            return False
        self.client_flow(link, link.transport_count, granted, drain, False)
        return True

    def settle(
        self,
        link: OutgoingLink,
        seqs: list[int],
        outcome: Outcome,
        delivery_failed: bool,
        *,
        undeliverable_here: bool = False,
        annotations: bytes | None = None,
    ) -> list[Dispatch]:
        """The client settled deliveries of a link; released ones may go to other consumers."""
        settled = min(len(seqs), link.unsettled)
        link.unsettled -= settled
        unsettled = self.unsettled
        unsettled.count -= settled
        if link.unsettled_held:
            unsettled.settled[link] = None
        return link.queue.settle(
            link,
            seqs,
            outcome,
            delivery_failed,
            undeliverable_here=undeliverable_here,
            annotations=annotations,
        )

    # -- deliveries from queues -----------------------------------------------------------

    def deliver(self, link: OutgoingLink, message: Message) -> None:
        """A queue dispatched a message to one of this session's links."""
        counted = link.counted
        if link.shares is not None and type(message) is Message:
            message = _shared(link, link.shares, message)
            counted = True
        self.outgoing_pending.append((link, message))
        link.waiting.append(message)
        cost = message.held + WAITING_DELIVERY_COST
        server_cost = WAITING_DELIVERY_COST if counted else cost
        self.pending_bytes += cost
        self.pending_server += server_cost
        self.waiting.charge(cost, server_cost)

    def deliver_all(self, link: OutgoingLink, messages: list[Message]) -> None:
        """A run of deliveries for one of this session's links (another worker's batch),
        charged once as :meth:`ask_queue` charges a local queue's. Their bytes are the
        channel's copy, held by nothing else here (``link.shares`` is a local queue's)."""
        if link.detached or not messages:
            return
        self.outgoing_pending.extend([(link, message) for message in messages])
        if not link.waiting:
            self.waiting.server.holding[link] = None
        link.idle = False
        link.waiting.extend(messages)
        # Another worker's deliveries hold their payload, all of it (queues/message.py
        # Imported): its size, without a property's call per message.
        sizes = [len(message.payload) for message in messages]
        held = sum(sizes)
        largest = max(sizes)
        grew = largest > link.largest
        if grew:
            link.largest = largest
        cost = held + len(messages) * WAITING_DELIVERY_COST
        server_cost = cost - held if link.counted else cost
        self.pending_bytes += cost
        self.pending_server += server_cost
        self.pending_imported += cost
        waiting = self.waiting
        waiting.charge(cost, server_cost, cost)
        # What arrived takes the room it was reserved in until the next flush counts it: the
        # reservation it turns into waiting bytes is no room for another (a link reserving
        # in the room freed so took its worker past the room by a delivery, Hypothesis's
        # example in tests/unit/session/test_import_reservations.py).
        waiting.server.import_room -= cost
        reserved = link.reserved
        if reserved:
            # They were reserved while on their way (session/waiting.py): now they wait.
            waiting.server.reserve(link, reserved - cost if reserved > cost else 0)
            if grew:
                self._reserve_coming(link)

    def _reserve_coming(self, link: OutgoingLink) -> None:
        """A delivery larger than any before on ``link`` came: what its queue may still send
        on the credit it holds is reserved at that size, within the room, and the credit is
        taken back past it. Reserved in the smaller unit, less each delivery that came, a
        40 KB delivery after 1 KB ones left nothing reserved for the four its queue could
        still send (found by Hypothesis, tests/unit/session/test_import_reservations.py)."""
        coming = link.queue_flow_ctl.credit - len(link.waiting)
        if coming <= 0:
            return
        owed = coming * import_unit(link)
        if owed <= link.reserved:
            return
        server = self.waiting.server
        room = max(server.room_for(link), 0)
        if owed <= room:
            server.reserve(link, owed)
            return
        server.reserve(link, max(room, link.reserved))
        if not link.credit_req_in_flight:
            self.take_back(link)

    def send_pending(self) -> list[Action]:
        """Hand over what the window and the writer allow, in order (RabbitMQ's send_pending)."""
        if self.stalled_links and self.can_hand_out:
            for link in list(self.stalled_links):
                self.unstall(link)
        out: list[Action] = []
        pending = self.outgoing_pending
        credit = self.writer_credit
        writer = self.writer
        handed = writer.handed
        # The writer's room, in bytes: what hands over here changes it, nothing else meanwhile.
        room_bytes = writer.room
        frame_payload = self.frame_payload
        # What the deliveries sent held, given back to the connection's charge at once (before
        # a credit reply, which may ask for more; a top-up meanwhile sees the charge as it was).
        sent_held = sent = 0
        # Of sent_held, what their queues count until settled (OutgoingLink.counted), and
        # what other workers' deliveries held (with their places).
        sent_counted = sent_imported = 0
        while pending:
            entry = pending[0]
            link, item = entry
            if link.detached or (link.stale and _given_back(link, item)):
                pending.popleft()
                continue
            if isinstance(item, Message):
                # The writer's room is in bytes: at least one frame while there is any.
                room = min(
                    self.remote_incoming_window, credit.credit, -(-room_bytes // frame_payload)
                )
                if room <= 0:
                    if self.pending_imported:
                        # Another worker's deliveries wait on a client that reads nothing now.
                        self.waiting.server.check_stalls = True
                    if self._bypass_due:
                        self._bypass(out)
                    break
                start = self.head_sent
                size = item.read_size()
                frames = -(-(size - start) // frame_payload) or 1
                if frames > room:
                    end = start + room * frame_payload
                    self.head_sent = end
                    self.remote_incoming_window -= room
                    handed(credit, room, end - start)
                    out.append(TransferPart(link, item, start, end))
                    break
                pending.popleft()
                link.waiting.popleft()
                # What it was charged: a plain message's payload (its wire size may be larger,
                # a raised delivery-count stamped as it is read), a stored one's maybe nothing.
                held = item.held
                sent_held += held
                shares = link.shares
                if shares is not None and type(item) is Message:
                    shares.let_go(item)
                    sent_counted += held
                elif link.counted:
                    sent_counted += held
                if link.imports:
                    sent_imported += held + WAITING_DELIVERY_COST
                    if not link.waiting:
                        self.waiting.server.holding.pop(link, None)
                sent += 1
                self.remote_incoming_window -= frames
                room_bytes = handed(credit, frames, size - start)
                if start:
                    self.head_sent = 0
                    out.append(TransferPart(link, item, start, size))
                else:
                    # The entry is the transfer, (link, message): no new tuple, and no cast()
                    # call per message to say so.
                    out.append(entry)  # type: ignore[arg-type]
                self._sent(link)
            elif type(item) is CreditReply:
                pending.popleft()
                if sent:
                    self._uncharge(
                        sent_held + sent * WAITING_DELIVERY_COST, sent_counted, sent_imported
                    )
                    sent_held = sent = sent_counted = sent_imported = 0
                self._credit_reply(link, item, out)
            else:
                pending.popleft()
                out.append(cast(LinkFlow, item))
        if sent:
            self._uncharge(sent_held + sent * WAITING_DELIVERY_COST, sent_counted, sent_imported)
        if self.pending_bytes and not self.outgoing_pending:
            # Nothing waits: nothing is charged, whatever a message's bytes became meanwhile.
            self._uncharge_all()
        if self.top_ups:
            self._top_up()
        return out

    # -- internals ------------------------------------------------------------------------

    def _bypass(self, out: list[Action]) -> None:
        """While deliveries wait, handle the credit replies of links with none waiting.

        Order matters only within a link (AMQP 1.0 §2.6.7): a reply waits behind its own link's
        deliveries, not behind other links'. Without this, a drain of one link would go
        unanswered for as long as another link's deliveries wait for the client's window.
        """
        pending = self.outgoing_pending
        kept: deque[_Pending] = deque()
        waiting: set[OutgoingLink] = set()
        while pending:
            entry = pending.popleft()
            link, item = entry
            if link.detached or (link.stale and _given_back(link, item)):
                continue
            if isinstance(item, Message) or link in waiting:
                waiting.add(link)
                kept.append(entry)
            elif type(item) is CreditReply:
                # New deliveries and the next reply it requests join the end of ``pending``.
                self._credit_reply(link, item, out)
            else:
                out.append(cast(LinkFlow, item))
        self.outgoing_pending = kept
        # Replies that joined meanwhile were walked here too.
        self._bypass_due = False

    def _uncharge(self, nbytes: int, counted: int = 0, imported: int = 0) -> None:
        """Deliveries worth ``nbytes`` left, ``counted`` of them counted by their queues,
        ``imported`` of them other workers'."""
        server = nbytes - counted
        self.pending_bytes -= nbytes
        self.pending_server -= server
        self.pending_imported -= imported
        self.waiting.charge(-nbytes, -server, -imported)

    def _uncharge_all(self) -> None:
        self.waiting.charge(-self.pending_bytes, -self.pending_server, -self.pending_imported)
        self.pending_bytes = self.pending_server = self.pending_imported = 0

    def _request_credit(self, link: OutgoingLink, credit: int, drain: bool) -> None:
        """Ask the queue for a batch, or defer the request while the connection's waiting
        deliveries are over its limit or, for deliveries that would be new bytes here, while the
        memory budget has no room for them (session/waiting.py): it is in flight either way. A held
        link's request asks for nothing, which costs nothing to make at once. Another worker's
        queue is asked for at most ``IMPORT_BATCH`` bytes by the largest delivery the link was
        sent, one before it was sent any, and for none by a drain while it may not ask; so is,
        while the budget is blocked, a local queue whose deliveries no queue counts
        (``OutgoingLink.uncounted``, sized as it is asked: :meth:`ask_queue`)."""
        if link.imports:
            if drain and not self.waiting.may_ask(link, credit or 1):
                # Nothing new may come now (session/waiting.py): a drain asks for none and is
                # answered at once, its credit spent (AMQP 1.0 §2.6.7).
                credit = 0
            else:
                credit = _import_batch(link, credit)
        elif drain and link.uncounted and not self.waiting.may_import():
            credit = 0
        link.queue_flow_ctl.credit = credit
        link.credit_req_in_flight = True
        if link.held or not self.waiting.defer(link, drain):
            self.ask_queue(link, drain)

    def _starved(self, link: OutgoingLink) -> bool:
        """Whether the link's request waits for the memory budget (session/waiting.py)."""
        waiting = self.waiting
        if link not in waiting.deferred:
            return False
        if link.imports:
            return not waiting.may_ask(link, link.queue_flow_ctl.credit or 1)
        return link.uncounted and not waiting.may_import()

    def ask_queue(self, link: OutgoingLink, drain: bool) -> None:
        """Request the credit the link's queue flow control holds; the batch and the reply
        join ``outgoing_pending``. Every request to a queue comes here: a held link's asks for
        none, which takes back what the queue held (a drain is then answered at once)."""
        queue_ctl = link.queue_flow_ctl
        # Deliveries no queue counts asked for while the budget is blocked: their largest
        # sizes the next request.
        gated = False
        if link.ack_required and queue_ctl.credit and self.unsettled.blocked and not link.held:
            # What is left of its share of the blocked budget (session/unsettled.py); none
            # holds it.
            queue_ctl.credit = self.unsettled.grant(link, queue_ctl.credit)
        if link.held:
            queue_ctl.credit = 0
        elif link.imports and queue_ctl.credit:
            self._reserve(link)
        elif link.uncounted and queue_ctl.credit:
            server = self.waiting.server
            if server.blocked:
                # Sized here, so that a request deferred before the budget blocked is too.
                queue_ctl.credit = _import_batch(link, queue_ctl.credit)
                gated = True
            else:
                # What its queue holds for it is taken back if the budget blocks.
                server.uncounted[link] = None
        messages, reply = link.queue.credit(link, queue_ctl.delivery_count, queue_ctl.credit, drain)
        if gated and messages:
            largest = max([message.held for message in messages])
            if largest > link.largest:
                link.largest = largest
        pending = self.outgoing_pending
        held = 0
        # Of held, what is counted elsewhere: by their queue, or as holders of their payload.
        counted = 0
        shares = link.shares
        if messages and shares is not None:
            # A pre-settled consumer's stored messages come with bodies read for it that no
            # queue shares: charged in full, as ``deliver`` charges them. Taken as holders of a
            # payload here, they were never let go once sent (only plain messages are), and
            # the held bytes kept each one's body for good, 2.7 MB after 89 of 30 KB.
            browse = link.browse
            messages = [
                _shared(link, shares, message) if browse or type(message) is Message else message
                for message in messages
            ]
            counted = sum(m.held for m in messages if type(m) is Message)
        for message in messages:
            pending.append((link, message))
            held += message.held
        if messages:
            link.waiting.extend(messages)
            cost = held + len(messages) * WAITING_DELIVERY_COST
            server_cost = cost - (held if link.counted else counted)
            self.pending_bytes += cost
            self.pending_server += server_cost
            self.waiting.charge(cost, server_cost)
        if reply is not None:
            pending.append((link, reply))
            self._bypass_due = True

    def _reserve(self, link: OutgoingLink) -> None:
        """Reserve what a request to another worker's queue lets it send, its credit capped
        to the server's room (session/waiting.py): the credit counts from what has left the
        session, so the deliveries waiting count against it and only the rest is on its way;
        credit the queue held before may still cross the request, so the larger stays."""
        queue_ctl = link.queue_flow_ctl
        server = self.waiting.server
        credit = queue_ctl.credit = server.import_credit(link, queue_ctl.credit)
        coming = credit - len(link.waiting)
        if coming > 0:
            # Within the room: only a link sent nothing yet is asked for more than it leaves.
            reserved = min(coming * import_unit(link), max(server.room_for(link), 0))
            if reserved > link.reserved:
                server.reserve(link, reserved)

    def preempt(self, link: OutgoingLink) -> None:
        """Another connection waits for the imports' part while this link's reservation
        waits for messages its queue does not have (``idle``): its credit is taken back, and
        once the reply gives the reservation back it asks again behind the connections
        already waiting (:meth:`_wait_behind`). Reserved credit on an empty queue is room
        lent, not held: three consumers waiting on empty queues across took the whole part,
        and a consumer of a queue with messages got none while the budget stayed blocked."""
        link.preempted = True
        link.idle = False
        self.take_back(link)

    def _wait_behind(self, link: OutgoingLink) -> None:
        """The preempted link's next request waits with its connection's deferred ones, the
        connection after those that waited before it, until a flush finds room
        (``budget_flushed``); it makes no one else lend (``Waiting.next_deferred``)."""
        client = link.client_flow_ctl
        queue_ctl = link.queue_flow_ctl
        if client.credit <= queue_ctl.credit:
            link.preempted = False
            return
        queue_ctl.credit = _import_batch(link, min(client.credit, link.batch))
        link.credit_req_in_flight = True
        waiting = self.waiting
        waiting.deferred[link] = False
        server = waiting.server
        server.starved[waiting] = None
        server.room_full = True

    def take_back(self, link: OutgoingLink) -> None:
        """Credit granted to another worker's queue beyond the server's room, or held by a
        local queue whose deliveries no queue counts when the budget blocks, is taken back:
        a request for none, made at once, as for a held link; its reply gives the
        reservation back, and the next request waits for the room or is asked as a blocked
        budget allows (session/waiting.py)."""
        link.queue_flow_ctl.credit = 0
        link.credit_req_in_flight = True
        self.ask_queue(link, False)

    def credit_replied(self, link: OutgoingLink, reply: CreditReply) -> None:
        """A queue of another worker answered a credit request.

        A drain's reply, or one the client asked an echo of, waits behind the deliveries that
        came before it, exactly as a local queue's: its FLOW must follow them (AMQP 1.0
        §2.6.7). Any other reply says only how much credit the queue kept, and is taken at
        once, so the next request may go before this batch has left the session: counted from
        what has left (``queue_flow_ctl``), the deliveries still waiting count against it, so
        no more than a batch per consumer ever waits, and the request stays the only one in
        flight (docs/outbound-flow-control.md#a-queue-that-answers-later).
        """
        client = link.client_flow_ctl
        server = self.waiting.server
        if link.stalled and not reply.credit:
            # Every delivery sent before the reply is here, and no more comes.
            self._give_back(link)
        # The credit kept is worth more than the room left: reserved as the room, and taken
        # back below.
        past_room = False
        if reply.credit or link.reserved:
            # All it sent before the reply has arrived: what it may still send is the credit
            # it kept; a link sent nothing yet keeps the room it was reserved (``_reserve``).
            owed = reply.credit * import_unit(link)
            if not link.largest and link.reserved:
                owed = min(owed, link.reserved)
            room = max(server.room_for(link), 0)
            if owed > room:
                # Its largest delivery grew while the request was out: credit asked for in
                # small units, kept and reserved in the large one, counted 81.9 MB on a 32 MB
                # worker for a moment, and every publisher there waited (adversary seed 65809).
                owed = room
                past_room = True
            server.reserve(link, owed)
        # Credit kept with nothing to send: a reservation that waits for messages to come.
        link.idle = reply.credit > 0 and not reply.available
        if reply.drain or client.echo:
            self.outgoing_pending.append((link, reply))
            self._bypass_due = True
            return
        queue_ctl = link.queue_flow_ctl
        # What the queue may still send counted from what left the session: the deliveries
        # waiting in it, then the credit the queue kept.
        queue_ctl.credit = serial_diff(reply.delivery_count, queue_ctl.delivery_count) + (
            reply.credit
        )
        link.credit_req_in_flight = False
        if link.stashed_credit_req is not None:
            self._pop_credit_req(link)
        elif link.held:
            if reply.credit:
                # Held while this request was out: the queue's credit is taken back.
                self._request_credit(link, 0, False)
        elif reply.credit and (past_room or server.reserved > server.import_room):
            # The budget filled while this request was out (session/waiting.py).
            self.take_back(link)
        elif link.preempted:
            self._wait_behind(link)
        elif queue_ctl.credit < link.top_up_below and client.credit > queue_ctl.credit:
            credit = min(client.credit, link.batch)
            if _import_batch(link, credit) > queue_ctl.credit:
                # Not when the queue holds a whole batch already (it had nothing to send):
                # asked again, an idle consumer of an empty queue made a round trip per pass.
                self._request_credit(link, credit, False)
        if link.short:
            self._ask_short(link)

    def shorted(self, link: OutgoingLink, size: int) -> None:
        """Another worker's queue holds back deliveries this link has credit for: the next
        costs ``size``, more than the bytes reserved for it let come (frames.Short). It is
        the link's largest delivery from now on, and the link asks again, reserving for it
        within the room, or waits for room as any request for imports does; while a request
        is out, once its reply is in."""
        largest = size - WAITING_DELIVERY_COST
        if largest > link.largest:
            link.largest = largest
        link.short = True
        self._ask_short(link)

    def _ask_short(self, link: OutgoingLink) -> None:
        """Ask again for a link held back by its queue's owner, unless a request is out (its
        reply asks) or the link asks for none anyway (held, or gone)."""
        if link.credit_req_in_flight:
            return
        link.short = False
        if link.held or link.detached:
            return
        client = link.client_flow_ctl
        self._request_credit(link, min(client.credit, link.batch), False)

    def _sent(self, link: OutgoingLink) -> None:
        """A delivery left the session (RabbitMQ's sent_pending_delivery), forced through even if
        credit dropped."""
        link.sent += 1
        if link.ack_required:
            link.unsettled += 1
            unsettled = self.unsettled
            unsettled.count += 1
            if unsettled.blocked:
                before = unsettled.since.setdefault(link, link.unsettled - 1)
                if link.unsettled - before >= unsettled.share and not link.unsettled_held:
                    unsettled.reach(link)
        client = link.client_flow_ctl
        client.delivery_count = (client.delivery_count + 1) & SERIAL_MASK
        if client.credit > 0:
            client.credit -= 1
        queue_ctl = link.queue_flow_ctl
        queue_ctl.delivery_count = (queue_ctl.delivery_count + 1) & SERIAL_MASK
        if queue_ctl.credit > 0:
            queue_ctl.credit -= 1
        if (
            queue_ctl.credit < link.top_up_below
            and client.credit > queue_ctl.credit
            and not link.credit_req_in_flight
            and not link.held
        ):
            # The mid-stream top-up: the queue's batch is used up (for a queue that answers
            # later, all but TOP_UP_FRACTION of it, asked once this send_pending ends) and
            # the client wants more.
            if link.imports:
                self.top_ups[link] = None
            else:
                self._request_credit(link, min(client.credit, link.batch), queue_ctl.drain)

    def _top_up(self) -> None:
        """Ask another worker's queues whose batch ran low during this send_pending for the
        next, now that what could be sent has left: counted from there, a request brings a
        whole batch when all of the last left at once, where one made as it ran low brought
        only what the quarter left made room for, and each request costs both workers a
        reactor pass (docs/outbound-flow-control.md#a-queue-that-answers-later)."""
        top_ups = self.top_ups
        for link in top_ups:
            client = link.client_flow_ctl
            queue_ctl = link.queue_flow_ctl
            if (
                queue_ctl.credit < link.top_up_below
                and client.credit > queue_ctl.credit
                and not link.credit_req_in_flight
                and not link.held
                and not link.detached
            ):
                self._request_credit(link, min(client.credit, link.batch), queue_ctl.drain)
        top_ups.clear()

    def _credit_reply(self, link: OutgoingLink, reply: CreditReply, out: list[Action]) -> None:
        """Handle the queue's reply once every earlier delivery has left (handle_credit_reply);
        then a link its queue's owner held back asks again (:meth:`shorted`)."""
        self._handle_credit_reply(link, reply, out)
        if link.short:
            self._ask_short(link)

    def _handle_credit_reply(
        self, link: OutgoingLink, reply: CreditReply, out: list[Action]
    ) -> None:
        client = link.client_flow_ctl
        queue_ctl = link.queue_flow_ctl
        held = link.held
        if not reply.drain:
            queue_ctl.delivery_count = reply.delivery_count
            if link.stashed_credit_req is not None:
                self._pop_credit_req(link)
            elif reply.credit == 0 and client.credit > 0 and not held:
                if link.preempted:
                    self._wait_behind(link)
                else:
                    self._request_credit(link, min(client.credit, link.batch), False)
            elif reply.credit and held:
                # Held while this request was out: the queue's credit is taken back.
                self._request_credit(link, 0, False)
            elif (
                link.uncounted
                and self.waiting.server.blocked
                and reply.credit > _import_batch(link, reply.credit)
            ):
                # The budget blocked while this request was out, or its batch brought a
                # delivery larger than any before: what its queue kept is more than a blocked
                # budget asks for now, and is taken back.
                self.take_back(link)
            else:
                link.credit_req_in_flight = False
                if client.echo:
                    out.append(
                        LinkFlow(link, client.delivery_count, client.credit, reply.available, False)
                    )
                    if (
                        link.imports
                        and link.largest
                        and reply.credit * import_unit(link) > link.reserved
                    ):
                        # Reserved as the room left (:meth:`credit_replied`): taken back now
                        # that the echo's reply is out of the way.
                        self.take_back(link)
            return
        if (
            reply.delivery_count == queue_ctl.delivery_count
            and client.credit > 0
            and not held
            and not ((link.imports or link.uncounted) and not self.waiting.may_import())
        ):
            # The queue spent the whole batch on messages: it may hold more, drain another round
            # (a held link's drain ends here: nothing more is handed out to it, nor to one that
            # would bring new bytes into a blocked budget).
            self._request_credit(link, min(client.credit, link.batch), True)
            return
        queue_ctl.credit = 0
        queue_ctl.drain = False
        queue_ctl.delivery_count = reply.delivery_count
        link.credit_req_in_flight = False
        if link.stashed_credit_req is not None:
            # A later client FLOW supersedes this drain. RabbitMQ answers the drain first, but
            # proton already holds the later FLOW's credit and drain flag, and its drained FLOW
            # would drain that credit too (gateway/proton/drain.py): credit the queue may still have
            # messages for, or that a client which turned drain off wants kept. The later FLOW
            # is acted on instead, and if it drains, its answer comes when the queue has no more.
            self._pop_credit_req(link)
            return
        client.delivery_count = serial_add(client.delivery_count, client.credit)
        out.append(LinkFlow(link, client.delivery_count, 0, reply.available, True, client.credit))
        client.credit = 0

    def _pop_credit_req(self, link: OutgoingLink) -> None:
        """The latest client FLOW applies: request credit from it (handle_credit_reply)."""
        stash = link.stashed_credit_req
        assert stash is not None
        link.stashed_credit_req = None
        client = link.client_flow_ctl
        desired = link_credit_snd(stash.delivery_count, stash.credit, client.delivery_count)
        client.credit = desired
        client.echo = stash.echo
        link.queue_flow_ctl.drain = stash.drain
        self._request_credit(link, min(desired, link.batch), stash.drain)

    def statistics(self) -> SessionStatistics:
        """A snapshot for metrics and tests."""
        links = list(self.links.values())
        return SessionStatistics(
            outgoing_pending=sum(1 for e in self.outgoing_pending if not e[0].detached),
            pending_deliveries=sum(len(link.waiting) for link in links),
            remote_incoming_window=self.remote_incoming_window,
            writer_blocked=self.writer_credit.blocked,
            writer_credit=self.writer_credit.credit,
            credit_requests_in_flight=sum(1 for link in links if link.credit_req_in_flight),
            stashed_credit_reqs=sum(1 for link in links if link.stashed_credit_req is not None),
            links=len(links),
            pending_bytes=self.pending_bytes,
        )


def route(dispatches: list[Dispatch]) -> set[LinkOwner]:
    """Put queue dispatches into their consumers' sessions; return the sessions to pump."""
    touched: set[LinkOwner] = set()
    for key, message in dispatches:
        link = cast(OutgoingLink, key)
        if link.detached:
            continue
        session = link.session
        session.deliver(link, message)
        touched.add(session)
    return touched


def apply_hold(debt: DeadLetterDebt) -> set[LinkOwner]:
    """Hold the links a connection's dead-letter debt says to hold, or let them all go once it
    is back at half its limit; return the sessions to pump."""
    touched: set[LinkOwner] = set()
    for link in debt.to_hold():
        session = cast(Session, link.session)
        session.hold(link)
        touched.add(session)
    for link in debt.let_go():
        session = cast(Session, link.session)
        session.release(link)
        touched.add(session)
    return touched


def resume(waiting: Waiting) -> set[LinkOwner]:
    """Make a connection's deferred credit requests, oldest first, until its waiting deliveries
    reach the limit again; return the sessions to pump."""
    touched: set[LinkOwner] = set()
    while (deferred := waiting.next_deferred()) is not None:
        link, drain = deferred
        link.preempted = False
        session = cast(Session, link.session)
        session.ask_queue(link, drain)
        touched.add(session)
    return touched


def _given_back(link: OutgoingLink, item: object) -> bool:
    """Whether ``item``, an entry of ``link`` in ``outgoing_pending``, is one it gave back: a
    message other than the one it still holds first, met before any that came since (they
    follow the ones given back), counted off ``link.stale`` as met."""
    if not isinstance(item, Message) or (link.waiting and link.waiting[0] is item):
        return False
    link.stale -= 1
    return True


def _import_batch(link: OutgoingLink, credit: int) -> int:
    """The most a request to another worker's queue asks for, or, while the budget is
    blocked, one to a local queue whose deliveries no queue counts: ``IMPORT_BATCH`` bytes by
    the link's largest delivery, one before it was sent any (session/waiting.py)."""
    if credit <= 1:
        return credit
    largest = link.largest
    return min(credit, max(1, IMPORT_BATCH // largest)) if largest else 1


def budget_flushed(
    server: WaitingBytes, blocked: bool, full: bool, import_room: int
) -> set[LinkOwner]:
    """The memory budget as a flush left it, which says whether consumers may ask another
    worker's queue for deliveries, new bytes here, and for how many (``import_room``,
    session/waiting.py): credit granted beyond the room is taken back, and when the budget
    lets go, is no longer ``full`` or has room again, the requests that waited for it are
    made, connection by connection, each as far as it now may; return the sessions to pump.
    When it blocks, what local queues whose deliveries no queue counts hold is taken back
    (:func:`take_back_uncounted`)."""
    unblocked = server.blocked and not blocked
    newly_blocked = blocked and not server.blocked
    let_go = unblocked or (server.full and not full)
    server.blocked = blocked
    server.full = full
    server.import_room = import_room
    touched: set[LinkOwner] = set()
    if newly_blocked and server.uncounted:
        touched |= take_back_uncounted(server)
    if blocked and (full or server.room_full) and server.starved and server.check_stalls:
        touched |= reclaim(server)
    elif unblocked and server.stalled:
        # Not at a mere "not full": the room a stalled link's giving back made is the
        # waiting consumer's, and a client that still reads nothing would take it again.
        for link in list(server.stalled):
            session = cast(Session, link.session)
            session.unstall(link)
            touched.add(session)
    if server.reserved > import_room:
        return touched | take_back(server)
    if server.room_full and server.reserved < import_room:
        server.room_full = False
        let_go = True
    if not (let_go and server.starved):
        return touched
    starved = list(server.starved)
    server.starved.clear()
    for connection in starved:
        touched |= resume(connection)
    return touched


def reclaim(server: WaitingBytes) -> set[LinkOwner]:
    """The imports' part is full and a connection waits for it: every link holding another
    worker's deliveries that its client does not read now (its session can hand nothing
    out) gives them back (``Session.stall``), and every link whose reservation waits on an
    empty queue lends it (``Session.preempt``); return the sessions to pump. Looked at once
    per change (``check_stalls``), over the links that hold or reserve some."""
    server.check_stalls = False
    touched: set[LinkOwner] = set()
    for link in list(server.holding):
        session = cast(Session, link.session)
        if not link.stalled and not session.can_hand_out:
            session.stall(link)
            touched.add(session)
    # Lent only as far as the connection waiting longest needs for its next request, the
    # oldest reservations first: lending every idle one at each wait made each FLOW of a
    # waiting client cost a credit round trip per link waiting on an empty queue.
    need = 0
    for waiting in server.starved:
        head = next(iter(waiting.deferred), None)
        if head is not None and head.imports and not head.preempted:
            need = import_unit(head) if head.largest else 1
            break
    for link in list(server.reserving):
        if need <= 0:
            break
        if link.idle and not link.credit_req_in_flight and not link.held:
            need -= link.reserved
            session = cast(Session, link.session)
            session.preempt(link)
            touched.add(session)
    return touched


def take_back_uncounted(server: WaitingBytes) -> set[LinkOwner]:
    """The budget blocked: the credit local queues hold for links whose deliveries no queue
    counts, granted while it had room, is taken back, so that what they hand out from now on
    is what a blocked budget asks for (session/waiting.py); return the sessions to pump.
    Without it, a pre-settled consumer's credit on a durable queue whose messages another
    consumer held brought them all when that consumer's connection dropped: 5 MB of their
    bodies waited in a session that was not read, in one pass (docs/bounds.md). A request
    deferred meanwhile asks for none now (a drain is answered), one out is taken back when
    its reply comes (``Session._credit_reply``), and each asks again from its reply. Looked
    at once per block, over the links that asked since the last one; one whose reply is
    still to come stays among them, for the reply may come once the budget let go and leave
    its queue the credit."""
    touched: set[LinkOwner] = set()
    awaited: dict[OutgoingLink, None] = {}
    for link in server.uncounted:
        if link.held:
            continue
        session = cast(Session, link.session)
        queue_ctl = link.queue_flow_ctl
        drain = session.waiting.forget(link)
        if drain is not None:
            queue_ctl.credit = 0
            session.ask_queue(link, drain)
        elif link.credit_req_in_flight:
            awaited[link] = None
            continue
        elif queue_ctl.credit > len(link.waiting):
            session.take_back(link)
        else:
            continue
        touched.add(session)
    server.uncounted = awaited
    return touched


def take_back(server: WaitingBytes) -> set[LinkOwner]:
    """Take back the oldest reservations, as far as ``server.reserved`` exceeds its room once
    the replies come (session/waiting.py); return the sessions to pump. A link with a request
    out is counted as taken: its reply takes it back (``Session.credit_replied``)."""
    excess = server.reserved - server.import_room
    touched: set[LinkOwner] = set()
    for link in list(server.reserving):
        if excess <= 0:
            break
        excess -= link.reserved
        if not link.credit_req_in_flight:
            session = cast(Session, link.session)
            session.take_back(link)
            touched.add(session)
    return touched


def _shared(link: OutgoingLink, held: HeldBytes, message: Message) -> Message:
    """What the session of ``link`` keeps of a plain message, counted in ``held`` as one more
    holder of its payload until it is sent or dropped, so that the payload counts once whether
    its queue (or a fan-out's other queues) let go of theirs first or not. A browser's is a copy
    sharing the payload of the one its queue keeps (counted there already); a pre-settled
    consumer's is the message itself, which its queue let go of as it handed it out."""
    if not link.browse:
        held.take(message)
        return message
    shared = message.copy(counted=True)
    shared.seq = message.seq
    held.take(shared)
    return shared
