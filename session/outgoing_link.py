"""One consumer link as the session sees it: the two halves of RabbitMQ's dual link (PR 11307).

Toward the client the session is the sender (``client_flow_ctl``); toward the queue it is the
receiver (``queue_flow_ctl``). The client's credit can be huge; the queue only ever gets a batch
of at most ``max_queue_credit`` at a time, with at most one credit request in flight, so no more
than one batch per consumer waits in the session (notes/rabbitmq-flow.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluicegate.queues.queue_type import QueueType

if TYPE_CHECKING:
    from sluicegate.session.session import Session


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


class OutgoingLink:
    """A link on which the session sends a queue's messages to a client."""

    __slots__ = (
        "__weakref__",
        "ack_required",
        "client_flow_ctl",
        "credit_req_in_flight",
        "detached",
        "handle",
        "queue",
        "queue_flow_ctl",
        "sent",
        "session",
        "stashed_credit_req",
        "unsettled",
    )

    def __init__(self, session: Session, handle: int, queue: QueueType, ack_required: bool) -> None:
        self.session = session
        self.handle = handle
        self.queue = queue
        self.ack_required = ack_required
        self.client_flow_ctl = ClientFlowCtl()
        self.queue_flow_ctl = QueueFlowCtl()
        self.credit_req_in_flight = False
        self.stashed_credit_req: CreditReq | None = None
        self.detached = False
        self.sent = 0
        # Deliveries sent and not yet settled by the client.
        self.unsettled = 0

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
        )
