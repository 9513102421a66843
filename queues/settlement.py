"""What a consumer's settlement does to the messages it acquired, outcome by outcome.

RabbitMQ 4's reading of AMQP 1.0's outcomes: ``accepted`` archives; ``rejected``, and
``modified`` with ``undeliverable-here``, dead-letter; ``released`` and the other ``modified``
requeue, a ``modified`` with ``delivery-failed`` counting a failed delivery. A ``modified``
outcome's annotations are merged into the message first, whatever becomes of it. A settlement
that comes after the delivery's lock expired changes nothing: the queue took the message back
then, and the consumer's link is told instead (:class:`~queues.queue_type.LockExpired`).

The queue puts what comes back in its order itself (:mod:`queues.classic`): here each message
only leaves the consumer and goes where its outcome sends it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from sluicegate.queues.backlog import Backlog
from sluicegate.queues.consumers import Consumer
from sluicegate.queues.dead_lettering import REJECTED, DeadLetterer
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.log.stored import archive_all
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome

__all__ = ["Outcomes", "Settled", "accept_all", "rewrite", "settle_each"]


@dataclass(slots=True)
class Settled:
    """What one settlement did."""

    accepted: int = 0
    rejected: int = 0
    # Back in the queue, in settlement order, and those of them whose delivery failed.
    returned: list[Message] = field(default_factory=list)
    failed: list[Message] = field(default_factory=list)
    # Settled after their lock expired: nothing changed.
    late: list[int] = field(default_factory=list)


def rewrite(held: HeldBytes, message: Message, change: Callable[[], None]) -> None:
    """Change an acquired message's bytes (annotations, delivery-count): the server's count of
    bytes held follows, out of the payload's share if the message gets bytes of its own."""
    held.rewrite(message, change)


@dataclass(frozen=True, slots=True)
class Outcomes:
    """A settlement's outcome and its ``modified`` fields."""

    outcome: Outcome
    delivery_failed: bool = False
    undeliverable_here: bool = False
    annotations: bytes | None = None


def accept_all(consumer: Consumer, seqs: list[int], backlog: Backlog, held: HeldBytes) -> int:
    """The common case, kept tight: ``accepted`` for deliveries of a consumer none of whose
    locks expired; each is archived in place. How many were."""
    unacked = consumer.unacked
    messages = backlog.messages
    accepted: list[Message] = []
    keep = accepted.append
    for seq in seqs:
        message = unacked.pop(seq, None)
        if message is not None:
            del messages[seq]
            keep(message)
    consumer.unacked_bytes -= held.let_go_all(accepted)
    archive_all(accepted)
    return len(accepted)


def settle_each(
    consumer: Consumer,
    seqs: list[int],
    outcomes: Outcomes,
    backlog: Backlog,
    dead_letterer: DeadLetterer,
    held: HeldBytes,
) -> Settled:
    """Apply one outcome to the deliveries ``seqs`` of ``consumer``; see the module docstring."""
    settled = Settled()
    unacked = consumer.unacked
    lost = consumer.lost
    outcome = outcomes.outcome
    modified = outcome is Outcome.MODIFIED
    give_up = outcome is Outcome.REJECTED or (modified and outcomes.undeliverable_here)
    failing = modified and outcomes.delivery_failed
    annotations = outcomes.annotations
    for seq in seqs:
        if seq in lost:
            # The first settlement after a lock expired is the late one, even if the message
            # was redelivered to this consumer since (same sequence number): ambiguous
            # settlements never archive.
            del lost[seq]
            settled.late.append(seq)
            continue
        message = unacked.pop(seq, None)
        if message is None:
            continue
        consumer.unacked_bytes -= message.held
        if outcome is Outcome.ACCEPTED:
            settled.accepted += 1
            backlog.archive(message)
            continue
        if annotations is not None:
            rewrite(held, message, partial(message.annotate, annotations))
        if give_up:
            if failing:
                rewrite(held, message, message.count_failed_delivery)
            settled.rejected += 1
            dead_letterer.send(message, REJECTED)
            continue
        settled.returned.append(message)
        if failing:
            settled.failed.append(message)
    return settled
