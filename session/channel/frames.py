"""What crosses the channel between a worker's sessions and another worker's queues.

The frames are RabbitMQ 4's credit API v2 (PR 11307) as messages: the session asks with
:class:`Credit` (the queue-side delivery-count it knows, the credit it wants, drain, echo) and
the queue answers with deliveries, then exactly one :class:`CreditReply` carrying its own
delivery-count. A consumer is named by the id its session's worker gave it at :class:`Attach`;
a delivery by the queue's sequence number, which settlements name in ranges.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

from sluicegate.wire.sections import Header

# How many counts an :class:`Answer` carries: QueueStatistics's fields after its name.
ANSWER_COUNTS: Final = 19


class Kind(enum.IntEnum):
    """The frame type byte on the wire."""

    ATTACH = 1
    DETACH = 2
    CREDIT = 3
    CREDIT_REPLY = 4
    DELIVERIES = 5
    SETTLE = 6
    PUBLISH = 7
    CONFIRM = 8
    ERROR = 9
    TOPOLOGY = 10
    QUERY = 11
    ANSWER = 12
    ATTACHED = 13
    LETTERS = 14
    GIVE_BACK = 15
    SHORT = 16


class Settled(enum.IntEnum):
    """A consumer's outcome (queues.queue_type.Outcome) and a publish's, as one byte."""

    ACCEPTED = 0
    RELEASED = 1
    REJECTED = 2
    MODIFIED = 3


class QueryOp(enum.IntEnum):
    """What a :class:`Query` asks of a queue's owner."""

    # Its counts, as a listing reads them: no use of the queue.
    COUNTS = 0
    # Its counts, as RabbitMQ's ``stat`` reads them: use, so its x-expires countdown restarts.
    STAT = 1
    # Drop its ready messages; the answer says how many.
    PURGE = 2
    # Delete it, as management on the owner would; the answer says how many ready messages
    # went with it (management's ``message_count``), which only the owner knows.
    DELETE = 3
    # Declare it (the query carries the declaration): the owner judges a declaration made on
    # another worker, so two made at once with different arguments cannot both win.
    DECLARE = 4
    # Declare an exchange (the query carries the declaration, the exchange's name in place of
    # a queue's): the worker the placement hash names for it judges a declaration made on
    # another worker, so two made at once with different types cannot both win.
    DECLARE_EXCHANGE = 5


@dataclass(frozen=True, slots=True)
class Attach:
    """A session in the sending worker consumes from a queue the receiving worker owns.

    ``filters`` is the consumer's filter set and stream offset as plain values
    (:mod:`.filter_sets`, empty for none): the owner compiles it as a local attach would, so no
    filter is shipped as code.
    """

    consumer: int
    vhost: str
    queue: str
    ack_required: bool
    browse: bool
    priority: int
    filters: bytes = b""


@dataclass(frozen=True, slots=True)
class Attached:
    """The owner took consumer ``consumer``: its session answers the client's ATTACH now. A
    refusal is an :class:`Error` instead, and the session refuses the ATTACH with it."""

    consumer: int


@dataclass(frozen=True, slots=True)
class Detach:
    """The consumer is gone; ``unsent`` are the deliveries its session never put on the wire
    (they go back as they were, the others count a failed attempt: QueueType.detach).

    ``delivery_count`` is the queue-side count the session had seen: deliveries the queue sent
    after it crossed the DETACH on the channel and go back as unsent too, so nothing a
    pre-settled consumer never received is lost.
    """

    consumer: int
    delivery_count: int
    unsent: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Deliveries a consumer's session hands back unsent while it stays attached: its client
    stopped reading while its worker's imports' part was full and another consumer waited for
    room (session/waiting.py). Sent once the queue holds no credit for the consumer, so no
    delivery crosses it; they go back as they were (QueueType.give_back)."""

    consumer: int
    unsent: tuple[int, ...]


# A credit request that puts no bound on the bytes its deliveries bring (a test's, a peer's
# consumer that counts nothing): the owner's byte limit is the largest it can be.
NO_BYTE_LIMIT: Final = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Credit:
    """A credit request: at most one in flight per consumer (:mod:`.ends`).

    ``byte_limit`` bounds the bytes of what the owner sends the consumer, counted from its
    first delivery on (each delivery's payload and ``WAITING_DELIVERY_COST``): what had
    arrived when the request left plus what the session reserved for what may still come
    (session/waiting.py). The owner holds back what would pass it and says so (:class:`Short`):
    reserved by the largest delivery seen, a batch of larger ones came whole, 6 MB past a
    worker's ceiling (docs/bounds.md).
    """

    consumer: int
    delivery_count: int
    credit: int
    drain: bool
    echo: bool
    byte_limit: int = NO_BYTE_LIMIT


@dataclass(frozen=True, slots=True)
class Short:
    """The owner holds back deliveries the consumer has credit for, since they would pass its
    byte limit; ``size`` is what the next one costs. Its session reserves for it and asks
    again, or waits for room (session/outbound.py ``Session.shorted``)."""

    consumer: int
    size: int


@dataclass(frozen=True, slots=True)
class CreditReply:
    """The queue's answer, after the deliveries the request released."""

    consumer: int
    delivery_count: int
    credit: int
    available: int
    drain: bool
    echo: bool


@dataclass(frozen=True, slots=True)
class Deliveries:
    """Messages for one consumer: sequence numbers and the payloads as the queue holds them.

    A payload is never decoded or re-encoded on the way: the encoder hands the sender's bytes
    objects to the socket as they are, the reader slices each out of its receive buffer once.
    """

    consumer: int
    seqs: tuple[int, ...]
    payloads: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Settle:
    """A consumer's settlement of the deliveries in ``ranges`` (first, last), inclusive."""

    consumer: int
    outcome: Settled
    ranges: tuple[tuple[int, int], ...]
    delivery_failed: bool = False
    undeliverable_here: bool = False
    annotations: bytes | None = None


# What the publishing worker read of a message's envelope, so that its owner need not read it
# again: when it expires (None: never), its header, and its delivery-count.
Stamp: TypeAlias = tuple[int | None, Header, int]


@dataclass(frozen=True, slots=True)
class Publish:
    """Messages for a queue the receiving worker owns, published with one exchange and routing
    key, with the ids ``publish``, ``publish + 1``, ...; :class:`Confirm` answers each once the
    owner has stored it (the publisher's credit is renewed only then).

    One frame carries a flush's run of such messages (``Remote.publish`` extends the last frame
    while it is still unsent), so the names cross and are read once per run, not per message.
    ``stamps`` are the envelopes as the publishing worker read them, one per payload.
    ``letters``: the run is dead letters, which no publisher's credit holds back: the owner
    stores them only below its limit, as its own letters are routed (gateway/peers.py).
    ``publisher``: the link they were published on, numbered by the publishing worker (0: none,
    a letter; 1: the HTTP API), which the owner charges what they store to while its budget
    is blocked (session/remote_publishers.py).
    """

    publish: int
    vhost: str
    queue: str
    exchange: str
    routing_key: str
    payloads: list[bytes]
    stamps: list[Stamp]
    letters: bool = False
    publisher: int = 0


@dataclass(frozen=True, slots=True)
class Confirm:
    """The outcome of the publishes ``first`` to ``last`` (inclusive); a refusal names its AMQP
    error condition and why."""

    first: int
    last: int
    outcome: Settled
    condition: str = ""
    description: str = ""


@dataclass(frozen=True, slots=True)
class Error:
    """The owner ended a consumer (its queue deleted, its settlement refused): the session
    detaches the client's link with this condition; consumer 0 is the channel itself."""

    consumer: int
    condition: str
    description: str


@dataclass(frozen=True, slots=True)
class Topology:
    """A change of a virtual host's queues, exchanges or bindings, or of the virtual hosts made
    at run time, made on the sending worker: every worker applies it, so that routing stays
    local (docs/workers.md). ``change`` is the change as an AMQP list (its verb first), so
    declaration arguments keep their AMQP types."""

    vhost: str
    change: bytes


@dataclass(frozen=True, slots=True)
class Query:
    """Management on the sending worker asks about a queue the receiving worker owns: its
    counts, a purge, its deletion or its declaration (``declaration``: the change as a
    :class:`Topology` frame carries it; empty for the others). :class:`Answer` answers it by
    ``query``, the id the asker gave."""

    query: int
    op: QueryOp
    vhost: str
    queue: str
    declaration: bytes = b""


@dataclass(frozen=True, slots=True)
class Answer:
    """The owner's answer to query ``query``: whether it has the queue, how many messages a
    purge dropped or a deletion took (for a declaration, 1 if it made the queue), and the
    queue's counts after it (queues.queue_type.QueueStatistics's numbers, in its field order,
    its three optional stream offsets as -1 when absent; zeros after a deletion)."""

    query: int
    found: bool
    purged: int
    counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Letters:
    """The dead-letter units consumer ``consumer``'s outcomes owe on the owner now: letters its
    settlements made there and not yet stored (session/dead_letter_debt.py). The session's
    worker charges the change since the last report to the consumer's link, so that the
    consumer is held as it would be by a local queue's letters (docs/workers.md)."""

    consumer: int
    owed: int


Frame: TypeAlias = (
    Attach
    | Attached
    | Detach
    | GiveBack
    | Credit
    | CreditReply
    | Deliveries
    | Settle
    | Publish
    | Confirm
    | Error
    | Topology
    | Query
    | Answer
    | Letters
    | Short
)


def ranges_of(seqs: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged inclusive ranges of sequence numbers: a client settles runs of deliveries,
    and a run of any length crosses as two integers."""
    if seqs:
        first, last = seqs[0], seqs[-1]
        # The common case, one run settled in order, checked in one C-level comparison.
        if last - first == len(seqs) - 1 and seqs == list(range(first, last + 1)):
            return ((first, last),)
    out: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if out and seq <= out[-1][1] + 1:
            if seq > out[-1][1]:
                out[-1] = (out[-1][0], seq)
            continue
        out.append((seq, seq))
    return tuple(out)
