"""The server's queues, exchanges and bindings: declared, listed, deleted, and used to route.

This is the one API that declares things, whoever asks: configuration at start, a link attach,
the management API, recovery from the durable log. Declarations are idempotent and refuse an
inequivalent redeclaration with ``amqp:precondition-failed`` (RabbitMQ's 406/409), naming the
argument that differs. The default exchange ``""`` routes to the queue named by the routing key;
``amq.direct``, ``amq.fanout``, ``amq.topic``, ``amq.headers`` and ``amq.match`` exist from the
start, as in RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sluicegate.queues.arguments import (
    QUEUE_TYPES,
    QueueArguments,
    check_properties,
    parse_arguments,
)
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.dead_lettering import DeadLetter, DeadLetterRouter
from sluicegate.queues.errors import AccessRefused, NotFound, PreconditionFailed, ResourceLocked
from sluicegate.queues.exchange_graph import DEFAULT_EXCHANGE, ExchangeGraph
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.leases import Leases
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Dispatch, QueueStatistics, QueueType
from sluicegate.queues.quorum import QuorumQueue
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.timed_queues import TimedQueues
from sluicegate.queues.topology_log import TopologyLog, loggable
from sluicegate.queues.volatile import VolatileQueue, is_reply_to


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What a declaration fixes about a queue; a redeclaration must repeat it."""

    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: QueueArguments
    raw_arguments: tuple[tuple[str, object], ...]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue as listings show it."""

    name: str
    settings: QueueSettings
    owner: object
    statistics: QueueStatistics


@dataclass(frozen=True, slots=True)
class QueueContext:
    """What every queue of a server shares: its clock, dead-letter outbox and held bytes."""

    clock: Clock
    dead_letters: list[DeadLetter]
    held: HeldBytes
    # Queues with deadlines pending; a queue type with none never joins.
    timed: TimedQueues


# How each queue type is built; another queue type (streams) registers its factory here.
QueueFactory = Callable[[str, QueueArguments, QueueContext], QueueType]


def _built_as(queue_class: type[ClassicQueue]) -> QueueFactory:
    """The factory of the classic queue or of a type built on it (quorum): same context."""

    def build(name: str, arguments: QueueArguments, context: QueueContext) -> QueueType:
        return queue_class(
            name,
            arguments,
            clock=context.clock,
            dead_letters=context.dead_letters,
            held=context.held,
            timed=context.timed,
        )

    return build


def _stream(name: str, arguments: QueueArguments, context: QueueContext) -> QueueType:
    return StreamQueue(name, arguments, clock=context.clock, held=context.held, timed=context.timed)


QUEUE_FACTORIES: dict[str, QueueFactory] = {
    "classic": _built_as(ClassicQueue),
    "quorum": _built_as(QuorumQueue),
    "stream": _stream,
}


class QueueRegistry(ExchangeGraph):
    """All queues of one server, and the exchange graph that routes to them."""

    def __init__(
        self,
        clock: Clock | None = None,
        store: TopologyLog | None = None,
        held: HeldBytes | None = None,
    ) -> None:
        self.clock = clock if clock is not None else Clock()
        self._queues: dict[str, QueueType] = {}
        # Every queue's name, sorted, kept until a queue is declared or deleted: listings page
        # through it (a sort of 100,000 names costs tens of milliseconds).
        self._names: tuple[str, ...] | None = None
        # Queues whose persistent messages go through the log.
        self._logged: set[str] = set()
        # The durable log: durable declarations are logged there (queues are durable by
        # default, as in RabbitMQ); None keeps everything in memory.
        super().__init__(self._queues, self._logged, self._queue_type, store)
        # Bytes every queue holds in memory, for the server's memory budget: shared by the
        # registries of all virtual hosts of a server.
        self.held = held if held is not None else HeldBytes()
        self.dead_letter_router = DeadLetterRouter(
            self.clock, self.route, self.persists, store, self.held
        )
        self.timed = TimedQueues()
        self.context = QueueContext(
            self.clock, self.dead_letter_router.outbox, self.held, self.timed
        )
        self._settings: dict[str, QueueSettings] = {}
        self._owners: dict[str, object] = {}
        # Queues declared with x-expires: unused for that long, they are deleted.
        self._leases = Leases()
        # Queues other workers own, held here as stand-ins (docs/workers.md): their leases and
        # messages are their owners'.
        self._stand_ins: set[str] = set()
        # Direct Reply-To queues, by name: routed to, never listed, gone with their consumer.
        self._volatile: dict[str, VolatileQueue] = {}
        # What deleted queues had counted, so server-wide totals never go back (metrics).
        self.deleted_published = 0
        self.deleted_delivered = 0
        # Told of each queue deleted, whatever deleted it: the records other workers'
        # publishers are weighed by forget it (gateway/peers.py). None: nobody is.
        self.gone: Callable[[QueueType], None] | None = None

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """Dead letters every queue hands over, routed by :meth:`route_dead_letters`."""
        return self.dead_letter_router.outbox

    # -- queues ---------------------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        arguments: Mapping[str, object] | None = None,
        *,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        owner: object = None,
    ) -> QueueType:
        """Return the queue called ``name``, creating it if absent (idempotent).

        ``owner`` identifies the connection of an exclusive queue; another owner is refused.
        """
        if not name:
            raise PreconditionFailed("a queue needs a name")
        parsed = parse_arguments(arguments)
        raw = tuple(sorted((arguments or {}).items()))
        settings = QueueSettings(durable, exclusive, auto_delete, parsed, raw)
        queue = self._queues.get(name)
        if queue is not None:
            self._check_equivalent(name, self._settings[name], settings)
            if exclusive and self._owners.get(name) is not owner:
                raise ResourceLocked(f"queue '{name}' is exclusive to another connection")
            # A redeclaration is use, as in RabbitMQ.
            self.renew_lease(name)
            return queue
        check_properties(
            parsed.queue_type, durable=durable, exclusive=exclusive, auto_delete=auto_delete
        )
        # A queue of the server's workers lives on one (its recorded home), the others hold a
        # stand-in; a connection's exclusive queue lives with its connection (docs/workers.md).
        placement = None if exclusive else self.placement
        remote = None if placement is None else placement.remote(name)
        queue = (
            QUEUE_FACTORIES[parsed.queue_type](name, parsed, self.context)
            if remote is None
            else remote
        )
        self._queues[name] = queue
        self._names = None
        self._settings[name] = settings
        if exclusive:
            self._owners[name] = owner
        if remote is not None:
            self._stand_ins.add(name)
        elif parsed.expires is not None:
            self._leases.grant(name, parsed.expires, self.clock.now)
        logs = durable and not exclusive and not auto_delete and remote is None
        if self.store is not None and logs:
            self.store.declare_queue(name, loggable(arguments))
            self._logged.add(name)
            queue.attach_store(self.store)
        if placement is not None:
            placement.changed(["queue", name, loggable(arguments), durable, auto_delete])
        return queue

    def take_declaration(
        self,
        name: str,
        arguments: Mapping[str, object] | None,
        *,
        durable: bool,
        auto_delete: bool,
    ) -> None:
        """A stand-in takes its owner's declaration in place of the one it was made with: a
        link that attached here declared the queue with the defaults as the owner declared it
        otherwise, the two crossed between the workers, and the owner's stands everywhere
        (docs/workers.md). A queue that lives here keeps its own."""
        if name not in self._stand_ins:
            raise PreconditionFailed(f"queue '{name}' lives here: its own declaration stands")
        parsed = parse_arguments(arguments)
        check_properties(
            parsed.queue_type, durable=durable, exclusive=False, auto_delete=auto_delete
        )
        raw = tuple(sorted((arguments or {}).items()))
        self._settings[name] = QueueSettings(durable, False, auto_delete, parsed, raw)

    def logged(self, name: str) -> bool:
        """True if ``name`` is a durable queue whose persistent messages are logged."""
        return name in self._logged

    def persists(self, queue: QueueType, message: Message) -> bool:
        """True if this message to ``queue`` goes through the log before it is confirmed.

        Only messages to durable queues do, and of those the ones the queue type logs:
        persistent messages (header ``durable = true``) of a classic queue, every message of
        a stream, as in RabbitMQ.
        """
        return queue.name in self._logged and queue.persists(message)

    def recover_queue(self, name: str, arguments: Mapping[str, object]) -> None:
        """Declare a durable queue the log holds and give it back what recovery found of it."""
        queue = self.declare_queue(name, arguments)
        if self.store is not None:
            queue.restore(self.store)

    def declare(self, name: str, *, create: bool = True) -> QueueType:
        """The queue a link attaches to: the existing one, or a new one with defaults (with
        ``create``; without, a missing queue raises :class:`NotFound`, RabbitMQ's answer).

        A Direct Reply-To queue is never declared so: it exists while its requester's link does.
        """
        queue = self._queues.get(name)
        if queue is not None:
            return queue
        if is_reply_to(name):
            volatile = self._volatile.get(name)
            if volatile is None:
                raise NotFound(f"no queue '{name}'")
            return volatile
        if not create:
            raise NotFound(f"no queue '{name}'")
        return self.declare_queue(name)

    def add_volatile(self, queue: VolatileQueue) -> VolatileQueue:
        """Serve a new Direct Reply-To queue, for a requester's link (gone when it detaches)."""
        self._volatile[queue.name] = queue
        return queue

    def remove_volatile(self, name: str) -> None:
        """Forget a Direct Reply-To queue whose requester's attach was refused."""
        self._volatile.pop(name, None)

    def route(
        self, exchange: str, routing_key: str, payload: bytes | memoryview = b""
    ) -> list[QueueType]:
        """:meth:`ExchangeGraph.route`, where the default exchange also finds reply queues."""
        if exchange == DEFAULT_EXCHANGE and routing_key not in self._queues:
            volatile = self._volatile.get(routing_key)
            if volatile is not None:
                return [volatile]
        return super().route(exchange, routing_key, payload)

    @staticmethod
    def _check_equivalent(name: str, current: QueueSettings, wanted: QueueSettings) -> None:
        for field in ("durable", "exclusive", "auto_delete"):
            if getattr(current, field) != getattr(wanted, field):
                raise PreconditionFailed(
                    f"inequivalent arg '{field}' for queue '{name}': received "
                    f"{getattr(wanted, field)} but current is {getattr(current, field)}"
                )
        old, new = dict(current.raw_arguments), dict(wanted.raw_arguments)
        for argument in sorted(old.keys() | new.keys()):
            if argument == "x-queue-type" and new.get(argument, "classic") == old.get(
                argument, "classic"
            ):
                continue
            if old.get(argument) != new.get(argument):
                raise PreconditionFailed(
                    f"inequivalent arg '{argument}' for queue '{name}': received "
                    f"{new.get(argument)!r} but current is {old.get(argument)!r}"
                )

    def get(self, name: str) -> QueueType | None:
        """Return the queue called ``name`` if it exists (a Direct Reply-To queue included)."""
        queue = self._queues.get(name)
        return queue if queue is not None else self._volatile.get(name)

    def owner(self, name: str) -> object:
        """The connection an exclusive queue belongs to; None for any other queue."""
        return self._owners.get(name)

    def queue(self, name: str) -> QueueType:
        """Return the queue called ``name``, or raise ``amqp:not-found``."""
        queue = self._queues.get(name)
        if queue is None:
            raise NotFound(f"no queue '{name}'")
        return queue

    def settings(self, name: str) -> QueueSettings:
        """How the queue called ``name`` was declared."""
        self.queue(name)
        return self._settings[name]

    def _queue_type(self, name: str) -> str:
        return self.settings(name).arguments.queue_type

    def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        """Delete a queue and its bindings; return how many ready messages it held.

        Deleting a queue that does not exist succeeds with 0, as in RabbitMQ.
        """
        queue = self._queues.get(name)
        if queue is None:
            return 0
        stats = queue.statistics()
        if if_unused and stats.consumers:
            raise PreconditionFailed(f"queue '{name}' in use")
        if if_empty and stats.ready + stats.unacked:
            raise PreconditionFailed(f"queue '{name}' not empty")
        # Its ready messages leave memory now; the memory budget must not count them any more.
        # A stand-in holds none: its owner deletes the queue when the deletion reaches it.
        if name not in self._stand_ins:
            queue.purge()
        self._stand_ins.discard(name)
        self.deleted_published += stats.published
        self.deleted_delivered += stats.delivered
        if name in self._logged and self.store is not None:
            self._logged.discard(name)
            self.store.delete_queue(name, ())
        del self._queues[name]
        self._names = None
        exclusive = self._settings.pop(name).exclusive
        self.timed.discard(queue)
        self._owners.pop(name, None)
        self._leases.release(name)
        self.remove_destination(name, to_exchange=False)
        if self.placement is not None and not exclusive:
            self.placement.changed(["delete-queue", name])
        if self.gone is not None:
            self.gone(queue)
        return stats.ready

    def purge_queue(self, name: str) -> int:
        """Drop a queue's ready messages; return how many."""
        return self.queue(name).purge()

    def queues(self) -> list[QueueInfo]:
        """Every queue, by name."""
        return [
            QueueInfo(name, self._settings[name], self._owners.get(name), queue.statistics())
            for name, queue in sorted(self._queues.items())
        ]

    def queue_names(self) -> tuple[str, ...]:
        """Every queue's name, sorted: for listings that read one queue at a time.

        The same tuple is returned until a queue is declared or deleted.
        """
        if self._names is None:
            self._names = tuple(sorted(self._queues))
        return self._names

    @property
    def queue_count(self) -> int:
        """How many queues exist."""
        return len(self._queues)

    def statistics(self) -> list[QueueStatistics]:
        """Every queue's counts, by name."""
        return [self._queues[name].statistics() for name in sorted(self._queues)]

    # -- dead letters ---------------------------------------------------------------------

    def route_dead_letters(self, room: int | None = None) -> list[Dispatch]:
        """Deliver a batch of pending dead letters to their dead-letter exchange's queues,
        their copies holding about ``room`` bytes at most (None: no limit). A letter waiting
        for room is weighed again at once if the bindings, exchanges or queues are fewer or
        more than they were: one that routed it may have gone."""
        topology = (self.binding_count, len(self._exchanges), len(self._queues))
        return self.dead_letter_router.route_all(room, topology)

    # -- time -----------------------------------------------------------------------------

    def expire(self) -> list[Dispatch]:
        """Run the due expiries and lock releases of every queue that has deadlines."""
        timed = self.timed
        due = timed.due(self.clock.now)
        dispatches: list[Dispatch] = []
        try:
            for queue in due:
                dispatches.extend(queue.expire())
        finally:
            # Timed again from their next deadlines, if they have any, whatever happened.
            for queue in due:
                timed.add(queue)
        return dispatches

    def next_deadline(self) -> int | None:
        """The earliest deadline of any queue: a message's, a lock's or an unused queue's."""
        deadlines = [
            d for d in (self.timed.next_deadline(), self._leases.next_deadline()) if d is not None
        ]
        return min(deadlines) if deadlines else None

    # -- queue expiry (x-expires) ---------------------------------------------------------

    def renew_lease(self, name: str) -> None:
        """A client used the queue (redeclared it, asked for its counts): its countdown restarts.

        RabbitMQ renews a queue's lease whenever it answers a declaration or a ``stat``
        (the counts a management ``GET /queues/NAME`` returns). A stand-in's use is told to
        its owner, where the lease is.
        """
        if name in self._stand_ins and self.placement is not None:
            self.placement.used(name)
            return
        self._leases.renew(name, self.clock.now)

    def consumer_left(self, queue: QueueType) -> None:
        """A consumer of ``queue`` detached: its x-expires countdown starts again now.

        While consumers are attached the queue is in use; its countdown runs from the moment
        the last one leaves, so the gateway reports every detach.
        """
        if isinstance(queue, VolatileQueue):
            self._volatile.pop(queue.name, None)
        elif self._queues.get(queue.name) is queue:
            self._leases.renew(queue.name, self.clock.now)

    def start_expiry_clocks(self) -> None:
        """Start every x-expires countdown now, when the server starts serving.

        Queues recovered from the log or declared by the configuration count from the start,
        as RabbitMQ's queues count from their own start after a restart.
        """
        self._leases.renew_all(self.clock.now)

    def expire_unused(self) -> list[str]:
        """Delete every queue unused for its x-expires; return their names.

        Unused means no consumer attached and no :meth:`renew_lease` for that long; publishing
        does not count, as in RabbitMQ. Messages go with the queue, not to its dead-letter exchange.
        """
        now = self.clock.now
        expired: list[str] = []
        for name in self._leases.due(now):
            if self._queues[name].statistics().consumers:
                # In use: its countdown starts again when the last consumer leaves.
                self._leases.renew(name, now)
                continue
            self.delete_queue(name)
            expired.append(name)
        return expired


__all__ = [
    "QUEUE_FACTORIES",
    "QUEUE_TYPES",
    "AccessRefused",
    "QueueContext",
    "QueueInfo",
    "QueueRegistry",
    "QueueSettings",
]
