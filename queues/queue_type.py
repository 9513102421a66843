"""What a queue type offers the session: RabbitMQ 4's credit API v2 (PR 11307, notes §4).

The session talks to every queue type through this interface only. A consumer starts with no
credit; the session asks for credit in batches with :meth:`QueueType.credit`, which hands out
deliveries and then exactly one credit reply, so the session can keep at most one request in
flight per consumer and queue its reply behind the deliveries that came before it.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeAlias

from queues.message import Message

# A consumer is whatever the session uses to name it (its outgoing link); queues only hash it.
ConsumerKey: TypeAlias = Hashable
# A delivery handed to some consumer, possibly not the one whose call produced it.
Dispatch: TypeAlias = tuple[ConsumerKey, Message]


class CreditReply(NamedTuple):
    """The queue's side of the link after a credit request (notes §4: always sent)."""

    delivery_count: int
    credit: int
    available: int
    drain: bool


class Outcome(enum.Enum):
    """The terminal delivery states a consumer settles with (AMQP 1.0 §3.4)."""

    ACCEPTED = "accepted"
    RELEASED = "released"
    REJECTED = "rejected"
    MODIFIED = "modified"


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    """A queue's counts for metrics and tests."""

    name: str
    ready: int
    unacked: int
    consumers: int
    ready_bytes: int
    published: int
    delivered: int
    acknowledged: int


class QueueType(Protocol):
    """The operations every queue type (classic, stream) implements."""

    name: str

    def attach(self, consumer: ConsumerKey, *, ack_required: bool) -> None:
        """Register a consumer with no credit (RabbitMQ: mode ``{credited, 0}``)."""

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Remove a consumer; what it held goes back, possibly to other consumers at once.

        ``unsent`` are deliveries its session never put on the wire: they return as they were.
        Everything else it held unsettled counts one failed delivery attempt.
        """

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        """Top up a consumer's credit: its deliveries first, then the one reply."""

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Store a message; consumers with credit may receive it at once."""

    def settle(
        self, consumer: ConsumerKey, seqs: list[int], outcome: Outcome, delivery_failed: bool
    ) -> list[Dispatch]:
        """Apply a consumer's outcome to the deliveries it names by sequence number."""

    def statistics(self) -> QueueStatistics:
        """Counts for metrics and tests."""
