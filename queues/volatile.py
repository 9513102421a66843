"""Direct Reply-To's queue (RabbitMQ 4.2's ``rabbit_volatile_queue``): no queue at all.

A requester attaches a receiving link with a dynamic source and the capability
``rabbitmq:volatile-queue``; the server names the link's address
``/queues/amq.rabbitmq.reply-to.<random>``, and responders publish their replies there (or to a
null target with that ``to``). A reply goes straight to the requester while its link has
credit and is dropped otherwise: nothing is buffered, delivered at most once (pre-settled),
never stored. Only the link that made it consumes from it, and it is gone when that link
detaches. The name is unguessable, so only who was told it can reply.

Credit alone does not bound what a requester holds: a requester that grants credit and never
reads would have every reply wait in its session. So a reply is also dropped while the
requester is :attr:`VolatileQueue.backlogged` (the gateway says when: its connection's waiting
deliveries at their limit), as RabbitMQ drops replies its writer cannot send fast enough.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Final

from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    ConsumerKey,
    ConsumerOptions,
    CreditReply,
    Dispatch,
    Outcome,
    QueueStatistics,
)
from sluicegate.queues.storage import QueueStore
from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd

# Every Direct Reply-To queue's name starts so (RabbitMQ's prefix).
REPLY_TO_PREFIX: Final = "amq.rabbitmq.reply-to."
# Random bytes in a name: as many as a UUID, so that replies cannot be sent by guessing.
_NAME_BYTES: Final = 18
_NO_DISPATCH: Final[list[Dispatch]] = []


def _never() -> bool:
    return False


def is_reply_to(name: str) -> bool:
    """Whether ``name`` is a Direct Reply-To queue's (whether or not it exists)."""
    return name.startswith(REPLY_TO_PREFIX)


class VolatileQueue:
    """One requester's reply queue, implementing :class:`queues.queue_type.QueueType`."""

    # Its deliveries are a responder's bytes on their way through, which the budget gated as
    # they were read, dropped while the requester is backlogged: not bytes a request brings
    # from storage, which a blocked budget asks for by bytes (session/outgoing_link.py
    # ``uncounted``); held to that, a requester had one reply in flight per write.
    passes_through: Final = True

    def __init__(self, name: str | None = None) -> None:
        self.name = (
            name if name is not None else REPLY_TO_PREFIX + secrets.token_urlsafe(_NAME_BYTES)
        )
        self._consumer: ConsumerKey | None = None
        # Set once the consumer has come: after it leaves, the queue is gone for good.
        self._claimed = False
        self._credit = 0
        self._delivery_count = 0
        self._published = 0
        self._delivered = 0
        # Replies that found the requester without credit, backlogged, or gone.
        self.dropped = 0
        # Whether the requester holds as many replies unsent as it may (set by the gateway).
        self.backlogged: Callable[[], bool] = _never

    @property
    def waiting_credit(self) -> int:
        """Replies the requester can take now: any beyond are dropped."""
        return self._credit

    @property
    def gone(self) -> bool:
        """Whether the requester's link has left (the queue then only drops)."""
        return self._claimed and self._consumer is None

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """The requester's link, once: RabbitMQ refuses any other consumer."""
        if self._claimed:
            raise PreconditionFailed(
                f"queue '{self.name}' is consumed only by the link that made it"
            )
        if ack_required or options.browse or options.filter is not None:
            raise PreconditionFailed(
                "a Direct Reply-To consumer takes every reply pre-settled, unfiltered"
            )
        self._claimed = True
        self._consumer = consumer

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """The requester left: replies not yet sent are dropped with the queue."""
        if consumer == self._consumer:
            self._consumer = None
            self._credit = 0
            self.dropped += len(unsent)
        return _NO_DISPATCH

    def give_back(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Replies are kept nowhere but in the requester's session: those given back are
        dropped, as replies the requester had no credit for are."""
        if consumer == self._consumer:
            self.dropped += len(unsent)
        return _NO_DISPATCH

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        """Set the requester's credit; nothing waits, so nothing is delivered now."""
        self._credit = link_credit_snd(delivery_count, credit, self._delivery_count)
        if drain:
            self._delivery_count = (self._delivery_count + self._credit) & SERIAL_MASK
            self._credit = 0
        return [], CreditReply(self._delivery_count, self._credit, 0, drain)

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Hand a reply to the requester if it has credit; drop it otherwise."""
        self._published += 1
        consumer = self._consumer
        if consumer is None or self._credit <= 0 or self.backlogged():
            self.dropped += 1
            return _NO_DISPATCH
        self._credit -= 1
        self._delivery_count = (self._delivery_count + 1) & SERIAL_MASK
        self._delivered += 1
        return [(consumer, message)]

    def settle(
        self,
        consumer: ConsumerKey,
        seqs: list[int],
        outcome: Outcome,
        delivery_failed: bool,
        *,
        undeliverable_here: bool = False,
        annotations: bytes | None = None,
    ) -> list[Dispatch]:
        """Replies go pre-settled: there is nothing to settle."""
        return _NO_DISPATCH

    def purge(self) -> int:
        """Nothing is ever held."""
        return 0

    def expire(self) -> list[Dispatch]:
        """Nothing is ever held, so nothing expires."""
        return _NO_DISPATCH

    def next_deadline(self) -> int | None:
        """No deadlines."""
        return None

    def statistics(self) -> QueueStatistics:
        """Counts for tests: replies delivered and dropped."""
        return QueueStatistics(
            name=self.name,
            ready=0,
            unacked=0,
            consumers=0 if self._consumer is None else 1,
            ready_bytes=0,
            published=self._published,
            delivered=self._delivered,
            acknowledged=self._delivered,
            dropped=self.dropped,
        )

    # -- storage: a reply queue is never durable, so none of this is ever asked --------------

    def attach_store(self, store: QueueStore) -> None:
        """Nothing is stored."""

    def restore(self, store: QueueStore) -> None:
        """Nothing was stored."""

    def persists(self, message: Message) -> bool:
        """Replies are never logged."""
        return False

    def as_stored(self, message: Message) -> Message:
        """Replies are never logged: the message as it is."""
        return message
