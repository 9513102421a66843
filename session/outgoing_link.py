"""One consumer link as the session sees it: the two halves of RabbitMQ's dual link (PR 11307).

Toward the client the session is the sender (``client_flow_ctl``); toward the queue it is the
receiver (``queue_flow_ctl``). The client's credit can be huge; the queue only ever gets a batch
of at most ``max_queue_credit`` at a time, with at most one credit request in flight, so no more
than one batch per consumer waits in the session (docs/outbound-flow-control.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import QueueType
from sluicegate.wire.serial import SERIAL_MASK, serial_add, serial_diff


class LinkOwner(Protocol):
    """The session a link belongs to, as the queue's deliveries for the link reach it."""

    def deliver(self, link: OutgoingLink, message: Message) -> None:
        """Queue ``message`` for ``link`` behind what waits in the session already."""


def granted_credit(credit: int, uncounted: int) -> int:
    """The credit a client granted, from the transport's ``credit`` of its sending link.

    Proton keeps that credit in a C ``int`` (the client's limit less our delivery-count). A
    negative value is either a client that lowered its limit below deliveries it had not
    counted yet (at most ``uncounted`` of them: no credit left) or a grant of 2**31 or more
    (link-credit is a uint, AMQP 1.0 §2.7.4), read back as the uint it is. The two overlap only
    for grants within ``uncounted`` of 2**32, where the lowered limit, the safe reading, wins.
    """
    if credit >= 0:
        return credit
    if -credit <= uncounted:
        return 0
    return credit & SERIAL_MASK


class ClientFlowCtl:
    """The link toward the client: what it granted, as seen by the sending session."""

    __slots__ = ("credit", "delivery_count", "echo")

    def __init__(self, delivery_count: int = 0) -> None:
        self.delivery_count = delivery_count
        self.credit = 0
        self.echo = False


class QueueFlowCtl:
    """The link from the queue: the batch of credit the queue currently holds."""

    __slots__ = ("credit", "delivery_count", "drain")

    def __init__(self) -> None:
        self.delivery_count = 0
        self.credit = 0
        self.drain = False


@dataclass(frozen=True, slots=True)
class CreditReq:
    """A client FLOW held back while a queue credit request is in flight (newest wins)."""

    delivery_count: int
    credit: int
    drain: bool
    echo: bool


@dataclass(frozen=True, slots=True)
class OutgoingLinkStatistics:
    """One consumer link's flow-control state for metrics and tests."""

    handle: int
    client_delivery_count: int
    client_credit: int
    queue_credit: int
    credit_req_in_flight: bool
    stashed_credit_req: bool
    drain: bool
    sent: int
    held: bool = False


class OutgoingLink:
    """A link on which the session sends a queue's messages to a client."""

    __slots__ = (
        "__weakref__",
        "ack_required",
        "batch",
        "browse",
        "client_flow_ctl",
        "counted",
        "credit_req_in_flight",
        "debt_held",
        "detached",
        "flow_count",
        "handle",
        "held",
        "idle",
        "imports",
        "largest",
        "preempted",
        "queue",
        "queue_flow_ctl",
        "reserved",
        "seen_drain",
        "seen_limit",
        "sent",
        "session",
        "shares",
        "short",
        "stale",
        "stalled",
        "stashed_credit_req",
        "top_up_below",
        "transport_count",
        "uncounted",
        "unsettled",
        "unsettled_held",
        "waiting",
    )

    def __init__(
        self, session: LinkOwner, handle: int, queue: QueueType, ack_required: bool
    ) -> None:
        self.session = session
        self.handle = handle
        self.queue = queue
        self.ack_required = ack_required
        # Whether its queue counts each message it delivers in the held bytes until it is
        # settled (a classic queue's unacked messages): a waiting delivery then adds only its
        # own cost to the server's count, not its message's bytes again (session/waiting.py).
        self.counted = ack_required and getattr(queue, "counts_unacked", False)
        # Set for a browser or a pre-settled consumer of such a queue: the held bytes that
        # count its waiting plain messages, whose payload their queue (or a fan-out's other
        # queues) may count too, so that it counts once (session/outbound.py).
        self.shares: HeldBytes | None = None
        # A browser: what it is given stays in its queue, so it waits as a copy of its own.
        self.browse = False
        self.client_flow_ctl = ClientFlowCtl()
        self.queue_flow_ctl = QueueFlowCtl()
        self.credit_req_in_flight = False
        self.stashed_credit_req: CreditReq | None = None
        # The queue's credit left below which the session asks for the next batch: at none
        # for a queue that answers at once; the session sets more for one that answers a
        # round trip later (session/outbound.py ``attach_link``).
        self.top_up_below = 1
        # The most one credit request asks its queue for, set as the session attaches it:
        # ``max_queue_credit``, or for another worker's queue ``max_import_credit``
        # (session/outbound.py).
        self.batch = 0
        # Its deliveries are bytes this worker did not hold (another worker's queue): asked
        # for only while the memory budget is not blocked, in batches of at most
        # ``IMPORT_BATCH`` bytes by the largest it was sent (session/waiting.py).
        self.imports = False
        # A local queue's deliveries that the session may charge the budget in full, bytes no
        # queue counts (a stream's reader, a pre-settled consumer handed stored messages with
        # their bodies read for it): while the budget is blocked they are asked for as
        # another worker's are, and the credit its queue holds when it blocks is taken back
        # (session/waiting.py). Set as the session attaches it.
        self.uncounted = False
        # The largest delivery it was sent (another worker's), or handed by a request made
        # while the budget was blocked (``uncounted``): what a request's bytes are sized by.
        self.largest = 0
        # Its queue's owner holds back deliveries past the bytes reserved (another worker's,
        # frames.Short): it asks again once no request is out (``Session.shorted``).
        self.short = False
        # Its queue's last reply kept credit with nothing to send (another worker's): what it
        # has reserved waits for messages not yet published, and is lent back when another
        # connection waits for the imports' part (``preempted`` until it asks again,
        # ``Session.preempt``).
        self.idle = False
        self.preempted = False
        # The bytes its queue may still send on the credit granted, reserved in the memory
        # budget until they arrive or the credit is given back (session/waiting.py).
        self.reserved = 0
        # Every credit request it makes asks its queue for none (``held``), for any of three
        # reasons: its connection's dead-letter debt (session/dead_letter_debt.py); another
        # worker's consumer, it gave back what it held unsent when its client stopped reading
        # and others waited for the imports' part (``stalled``, session/waiting.py); or the
        # blocked memory budget holds it for the deliveries it took unsettled since it
        # blocked (``unsettled_held``, session/unsettled.py).
        self.held = False
        self.debt_held = False
        self.stalled = False
        self.unsettled_held = False
        # Of its entries in outgoing_pending, those given back and not yet dropped.
        self.stale = 0
        self.detached = False
        self.sent = 0
        # Deliveries sent and not yet settled by the client.
        self.unsettled = 0
        # Its deliveries in the session's outgoing_pending, in order: what goes back to the
        # queue when it detaches, found without a walk over the other links' entries.
        self.waiting: deque[Message] = deque()
        # The transport's delivery-count of the link (deliveries it sent plus credit it
        # drained), which runs behind the session's while transfers wait inside it; the credit
        # limit (delivery-count + credit) and drain flag of the last client FLOW it showed, and
        # its delivery-count then: what was sent since may be missing from the next FLOW.
        self.transport_count = 0
        self.seen_limit = 0
        self.seen_drain = False
        self.flow_count = 0

    def flow_seen(self, credit: int, drain: bool, unsettled: int) -> int | None:
        """The transport shows the link's ``credit`` and ``drain`` after a flow event: the
        credit the client granted if that was a client FLOW, else None.

        Proton raises its flow event after every transfer it writes as well, and hides a
        FLOW's own fields; a change of the credit limit or of drain tells a FLOW apart.
        ``unsettled`` is how many deliveries the transport holds unsettled on the link.
        """
        limit = (self.transport_count + credit) & SERIAL_MASK
        if limit == self.seen_limit and drain == self.seen_drain:
            return None
        self.seen_limit = limit
        self.seen_drain = drain
        sent_since = serial_diff(self.transport_count, self.flow_count)
        self.flow_count = self.transport_count
        return granted_credit(credit, unsettled + sent_since)

    def flow_changed(self, credit: int, drain: bool) -> bool:
        """Whether the transport shows a client FLOW the session has not seen (what
        :meth:`flow_seen` would act on), without taking it in."""
        limit = (self.transport_count + credit) & SERIAL_MASK
        return limit != self.seen_limit or drain != self.seen_drain

    def drain_withdrawn(self, drained: int) -> None:
        """The FLOW that completed a drain was not sent: a later client FLOW superseded the
        drain before proton could send it, and proton would have drained that FLOW's credit
        too. The ``drained`` credit goes back onto the delivery-count; the later FLOW's
        credit, seen next, counts from there."""
        client = self.client_flow_ctl
        client.delivery_count = (client.delivery_count - drained) & SERIAL_MASK

    def transport_sent(self, count: int = 1) -> None:
        """The transport took ``count`` whole deliveries of the link."""
        self.transport_count = (self.transport_count + count) & SERIAL_MASK

    def transport_drained(self, credit: int) -> None:
        """The transport ended a drain, advancing the delivery-count by the credit left."""
        self.transport_count = serial_add(self.transport_count, credit)

    def statistics(self) -> OutgoingLinkStatistics:
        """A snapshot for metrics and tests."""
        return OutgoingLinkStatistics(
            handle=self.handle,
            client_delivery_count=self.client_flow_ctl.delivery_count,
            client_credit=self.client_flow_ctl.credit,
            queue_credit=self.queue_flow_ctl.credit,
            credit_req_in_flight=self.credit_req_in_flight,
            stashed_credit_req=self.stashed_credit_req is not None,
            drain=self.queue_flow_ctl.drain,
            sent=self.sent,
            held=self.held,
        )
