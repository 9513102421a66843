"""Dead-lettering: the messages a queue gives up on, routed to its dead-letter exchange.

A queue hands each message it gives up on (rejected, expired, past its delivery limit, pushed
out by overflow) to its :class:`DeadLetterer`, which puts a :class:`DeadLetter` in the server's
outbox when the queue has ``x-dead-letter-exchange``, or counts it dropped. The registry's
:class:`DeadLetterRouter` empties the outbox: each copy carries the death in its message
annotations (``x-opt-deaths``) and goes to the queues the dead-letter exchange routes it to. A
persistent copy for a durable queue is logged by an explicit call to the store before the queue
takes it.

Each dead letter is routed on its own: one that fails (a step the door's validation should have
made impossible) is recorded in :attr:`DeadLetterRouter.failures` with its queue and id for the
gateway to log, and goes back to the queue it came from, without its expiry so that it waits
there for a consumer instead of failing again; the rest of the batch goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NamedTuple

from sluicegate.queues.errors import NotFound
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Dispatch, QueueType
from sluicegate.queues.topology_log import TopologyLog
from sluicegate.wire.deaths import Death, is_cycle, record_death
from sluicegate.wire.errors import AmqpError, DecodeError

# Dead-letter reasons, as RabbitMQ names them in x-death / x-opt-deaths.
REJECTED: Final = "rejected"
EXPIRED: Final = "expired"
DELIVERY_LIMIT: Final = "delivery_limit"
MAXLEN: Final = "maxlen"


class DeadLetter(NamedTuple):
    """A message a queue gave up on, for its dead-letter exchange (RabbitMQ's reasons)."""

    queue: str
    message: Message
    reason: str
    exchange: str
    routing_key: str | None


class DeadLetterer:
    """One queue's side: where its dead letters go, and how many went or were dropped."""

    __slots__ = ("dead_lettered", "dropped", "exchange", "outbox", "queue", "routing_key")

    def __init__(
        self, queue: str, exchange: str | None, routing_key: str | None, outbox: list[DeadLetter]
    ) -> None:
        self.queue = queue
        self.exchange = exchange
        self.routing_key = routing_key
        self.outbox = outbox
        self.dead_lettered = 0
        # Given up on with no dead-letter exchange to go to.
        self.dropped = 0

    def send(self, message: Message, reason: str) -> None:
        """Hand ``message`` to the dead-letter exchange, or drop it when the queue has none."""
        exchange = self.exchange
        if exchange is None:
            self.dropped += 1
            return
        self.dead_lettered += 1
        self.outbox.append(DeadLetter(self.queue, message, reason, exchange, self.routing_key))


# Where a message published to an exchange with a routing key goes (the exchange graph's route).
Route = Callable[[str, str, bytes], list[QueueType]]
# Whether a message to a queue goes through the log (the registry's rule for durable queues).
Persists = Callable[[QueueType, Message], bool]
# The queue of a name, if it still exists.
Lookup = Callable[[str], QueueType | None]


class DeadLetterFailure(NamedTuple):
    """A dead letter that could not be routed: where it came from, which message, and why."""

    queue: str
    message: str
    error: str
    # False when it could not go back to its queue either (deleted, or full): it is lost.
    kept: bool


class DeadLetterRouter:
    """The registry's side: routes every pending dead letter to its exchange's queues."""

    def __init__(
        self,
        clock: Clock,
        route: Route,
        persists: Persists,
        store: TopologyLog | None,
        lookup: Lookup,
    ) -> None:
        self.clock = clock
        self._route = route
        self._persists = persists
        self._store = store
        self._lookup = lookup
        # Dead letters every queue hands over, routed by :meth:`route_all`.
        self.outbox: list[DeadLetter] = []
        # Dead letters lost because their exchange was missing or routed them nowhere.
        self.dropped = 0
        # Dead letters that failed, for the gateway to log (it empties the list).
        self.failures: list[DeadLetterFailure] = []

    def route_all(self) -> list[Dispatch]:
        """Deliver every pending dead letter to its dead-letter exchange's queues.

        Each copy carries the death in its annotations; a message that would loop back to a
        queue it already died in, with no rejection on the way, is dropped (RabbitMQ's rule).
        """
        dispatches: list[Dispatch] = []
        pending = self.outbox
        # Messages that failed in this pass: one failing again is not sent back a second time.
        failed: set[int] = set()
        while pending:
            batch = pending[:]
            pending.clear()
            for letter in batch:
                try:
                    dispatches.extend(self._deliver(letter))
                except Exception as error:
                    dispatches.extend(self._failed(letter, error, failed))
        return dispatches

    def _failed(self, letter: DeadLetter, error: Exception, failed: set[int]) -> list[Dispatch]:
        """Put the message back in its queue, as it was but for its expiry; record why."""
        message = letter.message
        source = self._lookup(letter.queue)
        dispatches: list[Dispatch] = []
        kept = False
        if source is not None and id(message) not in failed:
            failed.add(id(message))
            message.expires = None
            message.release()
            try:
                dispatches = source.enqueue(message)
                kept = True
            except AmqpError:
                message.discard()
        if not kept:
            self.dropped += 1
        logged = getattr(message, "message_id", None)
        described = f"{letter.reason} message {message.seq}" + (
            "" if logged is None else f" (log id {logged})"
        )
        self.failures.append(DeadLetterFailure(letter.queue, described, repr(error), kept))
        return dispatches

    def _deliver(self, letter: DeadLetter) -> list[Dispatch]:
        message = letter.message
        routing_key = letter.routing_key if letter.routing_key is not None else message.routing_key
        payload = message.read()
        try:
            targets = self._route(letter.exchange, routing_key, payload)
        except (NotFound, DecodeError):
            targets = []
        targets = [q for q in targets if not is_cycle(payload, q.name, letter.reason)]
        if not targets:
            self.dropped += 1
            return []
        death = Death(
            letter.queue,
            letter.reason,
            message.exchange,
            (message.routing_key,),
            self.clock.now,
        )
        try:
            payload = record_death(payload, death)
        except DecodeError:
            self.dropped += 1
            return []
        dispatches: list[Dispatch] = []
        for queue in targets:
            copy = Message(
                payload,
                message.delivery_count,
                exchange=letter.exchange,
                routing_key=routing_key,
                header=message.header,
            )
            logged = self._log(queue, copy)
            try:
                dispatches.extend(queue.enqueue(logged))
            except AmqpError:
                if logged is not copy:
                    logged.discard()
                self.dropped += 1
        return dispatches

    def _log(self, queue: QueueType, copy: Message) -> Message:
        """The copy as ``queue`` stores it: logged when it is persistent and ``queue`` durable.

        The original's settlement waits in the store's buffer until the next batch is taken
        (the gateway routes dead letters before it flushes the store), so the copy's enqueue
        record goes before it in the same batch: a crash can duplicate, never lose, the message.
        """
        store = self._store
        if store is None or not self._persists(queue, copy):
            return copy
        copy = queue.as_stored(copy)
        logged = store.enqueue(
            queue.name,
            copy.payload,
            self.clock.now,
            copy.expires,
            exchange=copy.exchange,
            routing_key=copy.routing_key,
            delivery_count=copy.delivery_count,
        )
        return logged
