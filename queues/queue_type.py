"""What a queue type offers the session: RabbitMQ 4's credit API v2 (PR 11307).

The session talks to every queue type through this interface only. A consumer starts with no
credit; the session asks for credit in batches with :meth:`QueueType.credit`, which hands out
deliveries and then exactly one credit reply, so the session can keep at most one request in
flight per consumer and queue its reply behind the deliveries that came before it
(docs/outbound-flow-control.md). Storage is a capability of each queue type too: the registry
hands a durable queue the store and the queue decides what it keeps there.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias

from sluicegate.queues.errors import QueueError
from sluicegate.queues.message import Message
from sluicegate.queues.storage import QueueStore

if TYPE_CHECKING:
    from sluicegate.queues.filters.filter_set import FilterSet
    from sluicegate.queues.filters.stream_filter import StreamFilter
    from sluicegate.queues.filters.view import ViewCache

# A consumer is whatever the session uses to name it (its outgoing link); queues only hash it.
ConsumerKey: TypeAlias = Hashable
# A delivery handed to some consumer, possibly not the one whose call produced it.
Dispatch: TypeAlias = tuple[ConsumerKey, Message]
# A consumer's filter: reads a message's properties sections (never its body) and says yes/no.
MessageFilter: TypeAlias = Callable[[Message], bool]


class Clock:
    """The time queues act on, in milliseconds since the epoch, set by whoever owns a clock.

    Queues are pure: they never read the time. The gateway sets :attr:`now` once per pass of
    its event loop; tests set it by hand.
    """

    __slots__ = ("now",)

    def __init__(self, now: int = 0) -> None:
        self.now = now


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a stream reader starts (``rabbitmq:stream-offset-spec``).

    ``kind`` is ``first``, ``last``, ``next``, ``offset`` (``value`` is the offset) or
    ``timestamp`` (``value`` in milliseconds since the epoch).
    """

    kind: str
    value: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """How a consumer takes messages: its filter, whether it browses, its priority.

    A browsing consumer (``distribution-mode = copy``) receives copies and acquires nothing.
    Among consumers with credit, those of higher priority (``rabbitmq:priority``) are served
    first; equal priorities share round robin.
    """

    filter: MessageFilter | None = None
    browse: bool = False
    priority: int = 0
    # Stream queues only: where the reader starts, and the filter values it wants (which a
    # stream applies from its chunk filters; other queues get them within ``filter``).
    offset: OffsetSpec | None = None
    stream_filter: StreamFilter | None = None
    # The cache the filters decode messages through: a queue charges what they decode to the
    # budget of work it spends per read.
    views: ViewCache | None = None
    # The filter set these were compiled from, which a queue another worker owns sends there
    # to be compiled again (session/channel/remote.py); None without one.
    filter_set: FilterSet | None = None


DEFAULT_CONSUMER: ConsumerOptions = ConsumerOptions()


class LockExpired(QueueError):
    """A settlement of deliveries whose lock had expired: it changed nothing for them.

    ``dispatches`` are what settling the other deliveries of the same call produced.
    """

    condition = "amqp:precondition-failed"

    def __init__(self, message: str, dispatches: list[Dispatch]) -> None:
        super().__init__(message)
        self.dispatches = dispatches


class CreditReply(NamedTuple):
    """The queue's side of the link after a credit request: always sent, after the deliveries."""

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
    # Messages that left without a consumer accepting them, by way.
    rejected: int = 0
    expired: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    overflowed: int = 0
    lock_expired: int = 0
    # Messages whose dead-lettering failed, held in the queue (never delivered) until it is
    # purged or deleted.
    dead_letter_failed: int = 0
    # Bytes of the messages it gave up on whose dead letters are not routed yet.
    dead_lettering_bytes: int = 0
    # Bytes of the messages consumers hold unsettled.
    unacked_bytes: int = 0
    # Stream queues: the first and last offsets held (None when empty), for Spark's planning.
    first_offset: int | None = None
    last_offset: int | None = None
    # A stream's offset for its next message, empty or not (retention may have removed all).
    next_offset: int | None = None


class QueueType(Protocol):
    """The operations every queue type (classic, stream) implements."""

    name: str

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """Register a consumer with no credit (RabbitMQ: mode ``{credited, 0}``)."""

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Remove a consumer; what it held goes back, possibly to other consumers at once.

        ``unsent`` are deliveries its session never put on the wire: they return as they were.
        Everything else it held unsettled counts one failed delivery attempt.
        """

    def give_back(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Take back deliveries the consumer's session never put on the wire, the consumer
        staying attached with no credit: they return as they were, as at a detach, so that a
        session whose client stopped reading frees what it held (session/waiting.py)."""

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply | None]:
        """Top up a consumer's credit: its deliveries first, then the one reply.

        A queue of another worker answers later (None here): its deliveries and then its reply
        reach the session when they cross the channel (session/channel/remote.py).
        """

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Store a message; consumers with credit may receive it at once."""

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
        """Apply a consumer's outcome to the deliveries it names by sequence number.

        A ``modified`` outcome may say ``delivery_failed`` (the header's delivery-count goes
        up), ``undeliverable_here`` (the message is given up on, as if rejected) and carry
        ``annotations`` (an encoded map of ``x-`` keys) to merge into the message.
        Raises :class:`LockExpired` (after settling the others) if any had lost its lock.
        """

    def purge(self) -> int:
        """Drop every available message; return how many."""

    def expire(self) -> list[Dispatch]:
        """Act on the deadlines passed at the clock's time: message TTLs, delivery locks."""

    def next_deadline(self) -> int | None:
        """The earliest time :meth:`expire` may have something to do, or ``None``."""

    def statistics(self) -> QueueStatistics:
        """Counts for metrics and tests."""

    # -- storage --------------------------------------------------------------------------

    def attach_store(self, store: QueueStore) -> None:
        """Keep this durable queue's messages through ``store`` from now on."""

    def restore(self, store: QueueStore) -> None:
        """Take back the messages recovery found for this queue in ``store``."""

    def persists(self, message: Message) -> bool:
        """True if ``message``, to this queue when it is durable, is logged."""

    def as_stored(self, message: Message) -> Message:
        """The message as the log records it, before :meth:`enqueue` takes the logged copy."""
