"""The server's queues, exchanges and bindings: declared, listed, deleted, and used to route.

This is the one API that declares things, whoever asks: configuration at start, a link attach,
the management API, recovery from the durable log. Declarations are idempotent and refuse an
inequivalent redeclaration with ``amqp:precondition-failed`` (RabbitMQ's 406/409), naming the
argument that differs. The default exchange ``""`` routes to the queue named by the routing key;
``amq.direct``, ``amq.fanout``, ``amq.topic``, ``amq.headers`` and ``amq.match`` exist from the
start, as in RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, cast

from sluicegate.queues.arguments import QUEUE_TYPES, QueueArguments, parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.errors import (
    AccessRefused,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from sluicegate.queues.exchanges import (
    Binding,
    Exchange,
    ExchangeSettings,
    ExchangeType,
    exchange_settings,
)
from sluicegate.queues.headers import Headers, routing_headers
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.log.records import Arguments
from sluicegate.queues.message import ARCHIVED, Message
from sluicegate.queues.queue_type import Clock, DeadLetter, Dispatch, QueueStatistics, QueueType
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.topology_log import TopologyLog
from sluicegate.wire.codec import Value
from sluicegate.wire.deaths import Death, is_cycle, record_death
from sluicegate.wire.errors import AmqpError, DecodeError
from sluicegate.wire.sections import read_header


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
    timed: set[QueueType]


@dataclass(slots=True)
class Lease:
    """A queue's x-expires countdown: it is deleted once unused for ``expires`` milliseconds."""

    expires: int
    # When it was last used: declared, redeclared, or left by a consumer.
    last_used: int

    @property
    def deadline(self) -> int:
        """When the queue goes if nothing uses it before."""
        return self.last_used + self.expires


# How each queue type is built; another queue type (streams) registers its factory here.
QueueFactory = Callable[[str, QueueArguments, QueueContext], QueueType]


def _classic(name: str, arguments: QueueArguments, context: QueueContext) -> QueueType:
    return ClassicQueue(
        name,
        arguments,
        clock=context.clock,
        dead_letters=context.dead_letters,
        held=context.held,
        timed=context.timed,
    )


def _stream(name: str, arguments: QueueArguments, context: QueueContext) -> QueueType:
    return StreamQueue(name, arguments, clock=context.clock, held=context.held, timed=context.timed)


QUEUE_FACTORIES: dict[str, QueueFactory] = {"classic": _classic, "stream": _stream}
DEFAULT_EXCHANGE: Final = ""
_PREDECLARED: Final = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}


class QueueRegistry:
    """All queues, exchanges and bindings of one server."""

    def __init__(
        self,
        clock: Clock | None = None,
        store: TopologyLog | None = None,
        held: HeldBytes | None = None,
    ) -> None:
        self.clock = clock if clock is not None else Clock()
        # The durable log: durable declarations are logged there (queues are durable by
        # default, as in RabbitMQ); None keeps everything in memory.
        self.store = store
        # Queues whose persistent messages go through the log.
        self._logged: set[str] = set()
        # Exchanges whose bindings to logged queues are logged: the durable ones.
        self._logged_exchanges: set[str] = set(_PREDECLARED)
        # Dead letters every queue hands over, routed by :meth:`route_dead_letters`.
        self.dead_letters: list[DeadLetter] = []
        # Bytes every queue holds in memory, for the server's memory budget: shared by the
        # registries of all virtual hosts of a server.
        self.held = held if held is not None else HeldBytes()
        self.timed: set[QueueType] = set()
        self.context = QueueContext(self.clock, self.dead_letters, self.held, self.timed)
        self._queues: dict[str, QueueType] = {}
        self._settings: dict[str, QueueSettings] = {}
        self._owners: dict[str, object] = {}
        # Queues declared with x-expires: unused for that long, they are deleted.
        self._leases: dict[str, Lease] = {}
        self._exchanges: dict[str, Exchange] = {}
        # Dead letters lost because their exchange was missing or routed them nowhere.
        self.dead_letters_dropped = 0
        # What deleted queues had counted, so server-wide totals never go back (metrics).
        self.deleted_published = 0
        self.deleted_delivered = 0
        for name, kind in _PREDECLARED.items():
            self._exchanges[name] = Exchange(name, exchange_settings(kind))

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
        queue = QUEUE_FACTORIES[parsed.queue_type](name, parsed, self.context)
        self._queues[name] = queue
        self._settings[name] = settings
        if exclusive:
            self._owners[name] = owner
        if parsed.expires is not None:
            self._leases[name] = Lease(parsed.expires, self.clock.now)
        if self.store is not None and durable and not exclusive and not auto_delete:
            self.store.declare_queue(name, _loggable(arguments))
            self._logged.add(name)
            if isinstance(queue, ClassicQueue):
                queue.pager = self.store.pager(name)
            elif isinstance(queue, StreamQueue):
                queue.entries = self.store.stream_entries(name)
        return queue

    def logged(self, name: str) -> bool:
        """True if ``name`` is a durable queue whose persistent messages are logged."""
        return name in self._logged

    def persists(self, queue: QueueType, payload: bytes) -> bool:
        """True if this message to ``queue`` goes through the log before it is confirmed.

        Persistent messages (header ``durable = true``) to durable queues do, and every
        message of a durable stream, as in RabbitMQ.
        """
        if queue.name not in self._logged:
            return False
        return isinstance(queue, StreamQueue) or read_header(payload).durable

    def declare(self, name: str) -> QueueType:
        """The queue a link attaches to: the existing one, or a new one with defaults."""
        queue = self._queues.get(name)
        return queue if queue is not None else self.declare_queue(name)

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
        """Return the queue called ``name`` if it exists."""
        return self._queues.get(name)

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
        queue.purge()
        self.deleted_published += stats.published
        self.deleted_delivered += stats.delivered
        if name in self._logged and self.store is not None:
            self._logged.discard(name)
            self.store.delete_queue(name, ())
        del self._queues[name]
        del self._settings[name]
        self.timed.discard(queue)
        self._owners.pop(name, None)
        self._leases.pop(name, None)
        self._remove_destination(name, to_exchange=False)
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

    @property
    def queue_count(self) -> int:
        """How many queues exist."""
        return len(self._queues)

    def statistics(self) -> list[QueueStatistics]:
        """Every queue's counts, by name."""
        return [self._queues[name].statistics() for name in sorted(self._queues)]

    # -- exchanges and bindings -----------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type_name: str = "direct",
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, object] | None = None,
    ) -> Exchange:
        """Return the exchange called ``name``, creating it if absent (idempotent)."""
        settings = exchange_settings(
            type_name,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        if name == DEFAULT_EXCHANGE:
            raise AccessRefused("the default exchange cannot be declared")
        exchange = self._exchanges.get(name)
        if exchange is not None:
            _check_exchange(name, exchange.settings, settings)
            return exchange
        if name.startswith("amq."):
            raise AccessRefused(f"exchange names starting with 'amq.' are reserved: '{name}'")
        exchange = self._exchanges[name] = Exchange(name, settings)
        if self.store is not None and durable:
            self.store.declare_exchange(
                name,
                type_name,
                _loggable(arguments),
                auto_delete=auto_delete,
                internal=internal,
            )
            self._logged_exchanges.add(name)
        return exchange

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and its bindings (deleting one that does not exist succeeds).

        Its bindings as a source and as a destination go with it; a source left without
        bindings goes too if it is auto-delete, as in RabbitMQ.
        """
        if name == DEFAULT_EXCHANGE or name in _PREDECLARED:
            raise AccessRefused(f"exchange '{name}' cannot be deleted")
        exchange = self._exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"exchange '{name}' in use")
        del self._exchanges[name]
        if name in self._logged_exchanges and self.store is not None:
            self._logged_exchanges.discard(name)
            self.store.delete_exchange(name)
        self._remove_destination(name, to_exchange=True)

    def _remove_destination(self, name: str, *, to_exchange: bool) -> None:
        """Remove every binding to a deleted queue or exchange, then auto-delete the emptied.

        The log needs no record per binding: recovery drops the bindings of whatever a
        deletion record names.
        """
        emptied = [
            exchange
            for exchange in list(self._exchanges.values())
            if exchange.unbind_destination(name, to_exchange=to_exchange)
        ]
        for exchange in emptied:
            self._auto_delete(exchange)

    def exchange(self, name: str) -> Exchange:
        """Return the exchange called ``name``, or raise ``amqp:not-found``."""
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange '{name}'")
        return exchange

    def exchanges(self) -> list[Exchange]:
        """Every declared exchange, by name (the default exchange is implicit)."""
        return [self._exchanges[name] for name in sorted(self._exchanges)]

    def bind(
        self,
        source: str,
        destination: str,
        binding_key: str = "",
        arguments: Mapping[str, object] | None = None,
        *,
        to_exchange: bool = False,
    ) -> Binding:
        """Bind a queue (or, ``to_exchange``, an exchange) to an exchange (idempotent)."""
        if source == DEFAULT_EXCHANGE or (to_exchange and destination == DEFAULT_EXCHANGE):
            raise AccessRefused("the default exchange cannot be bound")
        exchange = self.exchange(source)
        if to_exchange:
            self.exchange(destination)
            queue_type = ""
        else:
            queue_type = self.settings(destination).arguments.queue_type
        logged = _loggable(arguments)
        exchange.check(binding_key, logged, queue_type)
        binding = Binding(
            source, destination, binding_key, tuple(sorted(logged.items())), to_exchange
        )
        if (
            exchange.bind(binding)
            and self.store is not None
            and source in self._logged_exchanges
            and destination in (self._logged_exchanges if to_exchange else self._logged)
        ):
            self.store.bind(source, destination, binding_key, logged, to_exchange=to_exchange)
        return binding

    def unbind(
        self,
        source: str,
        destination: str,
        binding_key: str = "",
        arguments: Mapping[str, object] | None = None,
        *,
        to_exchange: bool = False,
    ) -> bool:
        """Remove the binding with exactly these ends, key and arguments; False if none."""
        exchange = self._exchanges.get(source)
        if exchange is None:
            return False
        logged = _loggable(arguments)
        binding = Binding(
            source, destination, binding_key, tuple(sorted(logged.items())), to_exchange
        )
        if exchange.unbind(binding.key) is None:
            return False
        if self.store is not None:
            self.store.unbind(source, destination, binding_key, logged, to_exchange=to_exchange)
        self._auto_delete(exchange)
        return True

    def _auto_delete(self, exchange: Exchange) -> None:
        """Delete an auto-delete exchange whose last binding as a source just went.

        RabbitMQ's rule; bindings where it is the destination do not keep it.
        """
        if exchange.settings.auto_delete and not exchange.bindings:
            self.delete_exchange(exchange.name)

    def bindings(
        self,
        source: str | None = None,
        destination: str | None = None,
        *,
        to_exchange: bool | None = None,
    ) -> list[Binding]:
        """Bindings, optionally only those from ``source``, to ``destination``, of one kind."""
        found: list[Binding] = []
        for exchange in self.exchanges():
            if source is not None and exchange.name != source:
                continue
            found.extend(
                binding
                for binding in exchange.bindings.values()
                if (destination is None or binding.destination == destination)
                and (to_exchange is None or binding.to_exchange is to_exchange)
            )
        return found

    def route(
        self, exchange: str, routing_key: str, payload: bytes | memoryview = b""
    ) -> list[QueueType]:
        """The queues a message published to ``exchange`` with ``routing_key`` goes to.

        ``payload`` is the encoded message, whose headers are read only if a headers exchange
        is on the way. An exchange that routes nowhere passes the message to its alternate
        exchange, if any. Raises ``amqp:not-found`` for an exchange that does not exist, and
        ``amqp:decode-error`` for headers a headers exchange cannot read.
        """
        if exchange == DEFAULT_EXCHANGE:
            queue = self._queues.get(routing_key)
            return [queue] if queue is not None else []
        found = self._exchanges.get(exchange)
        if found is None:
            raise NotFound(f"no exchange '{exchange}'")
        if found.plain:
            queues = self._queues
            targets = [queues[q] for q in found.route(routing_key) if q in queues]
            if targets or found.settings.alternate_exchange is None:
                return targets
        return self._route_through(found, routing_key, payload)

    def _route_through(
        self, start: Exchange, routing_key: str, payload: bytes | memoryview
    ) -> list[QueueType]:
        """Follow exchange-to-exchange bindings and alternate exchanges, each exchange once.

        As in RabbitMQ, an exchange whose bindings take the message nowhere (no queue and no
        exchange) passes it to its alternate exchange; a queue reached several ways gets one
        copy, and a cycle of bindings ends where it meets an exchange already visited.
        """
        headers: Headers | None = None
        seen = {start.name}
        pending = [start]
        reached: dict[str, None] = {}
        for exchange in pending:
            queues: Iterable[str]
            onward: Iterable[str]
            if exchange.type is ExchangeType.HEADERS:
                if headers is None:
                    headers = routing_headers(payload)
                queues, onward = exchange.route_headers(headers)
            elif exchange.plain:
                queues, onward = exchange.route(routing_key), ()
            else:
                queues = exchange.route(routing_key)
                onward = exchange.route_exchanges(routing_key)
            if not queues and not onward:
                alternate = exchange.settings.alternate_exchange
                onward = () if alternate is None else (alternate,)
            reached.update(dict.fromkeys(queues))
            for name in onward:
                if name not in seen:
                    seen.add(name)
                    following = self._exchanges.get(name)
                    if following is not None:
                        pending.append(following)
        found = self._queues
        return [found[q] for q in reached if q in found]

    # -- dead letters ---------------------------------------------------------------------

    def route_dead_letters(self) -> list[Dispatch]:
        """Deliver every pending dead letter to its dead-letter exchange's queues.

        Each copy carries the death in its annotations; a message that would loop back to a
        queue it already died in, with no rejection on the way, is dropped (RabbitMQ's rule).
        """
        dispatches: list[Dispatch] = []
        pending = self.dead_letters
        while pending:
            batch = pending[:]
            pending.clear()
            for letter in batch:
                dispatches.extend(self._dead_letter(letter))
        return dispatches

    def _dead_letter(self, letter: DeadLetter) -> list[Dispatch]:
        message = letter.message
        routing_key = letter.routing_key if letter.routing_key is not None else message.routing_key
        payload = message.payload
        try:
            targets = self.route(letter.exchange, routing_key, payload)
        except (NotFound, DecodeError):
            targets = []
        targets = [q for q in targets if not is_cycle(payload, q.name, letter.reason)]
        if not targets:
            self.dead_letters_dropped += 1
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
            self.dead_letters_dropped += 1
            return []
        dispatches: list[Dispatch] = []
        for queue in targets:
            copy = Message(
                payload,
                message.delivery_count,
                exchange=letter.exchange,
                routing_key=routing_key,
            )
            logged = self._log_dead_letter(queue, copy)
            try:
                dispatches.extend(queue.enqueue(logged))
            except AmqpError:
                if logged is not copy:
                    logged.state = ARCHIVED
                self.dead_letters_dropped += 1
        return dispatches

    def _log_dead_letter(self, queue: QueueType, copy: Message) -> Message:
        """The copy as ``queue`` stores it: logged when it is persistent and ``queue`` durable.

        The original's settlement waits in the store's buffer until the next batch is taken
        (the gateway routes dead letters before it flushes the store), so the copy's enqueue
        record goes before it in the same batch: a crash can duplicate, never lose, the message.
        """
        store = self.store
        if store is None or not self.persists(queue, copy.payload):
            return copy
        if isinstance(queue, StreamQueue):
            copy = queue.stamp(copy)
        logged = store.enqueue(
            queue.name,
            copy.payload,
            self.clock.now,
            copy.expires,
            exchange=copy.exchange,
            routing_key=copy.routing_key,
        )
        logged.delivery_count = copy.delivery_count
        return logged

    # -- time -----------------------------------------------------------------------------

    def expire(self) -> list[Dispatch]:
        """Run the due expiries and lock releases of every queue that has deadlines."""
        now = self.clock.now
        dispatches: list[Dispatch] = []
        for queue in list(self.timed):
            deadline = queue.next_deadline()
            if deadline is None:
                self.timed.discard(queue)
            elif deadline <= now:
                dispatches.extend(queue.expire())
        return dispatches

    def next_deadline(self) -> int | None:
        """The earliest deadline of any queue: a message's, a lock's or an unused queue's."""
        deadlines = [d for q in self.timed if (d := q.next_deadline()) is not None]
        deadlines.extend(lease.deadline for lease in self._leases.values())
        return min(deadlines) if deadlines else None

    # -- queue expiry (x-expires) ---------------------------------------------------------

    def renew_lease(self, name: str) -> None:
        """A client used the queue (redeclared it, asked for its counts): its countdown restarts.

        RabbitMQ renews a queue's lease whenever it answers a declaration or a ``stat``
        (the counts a management ``GET /queues/NAME`` returns).
        """
        lease = self._leases.get(name)
        if lease is not None:
            lease.last_used = self.clock.now

    def consumer_left(self, queue: QueueType) -> None:
        """A consumer of ``queue`` detached: its x-expires countdown starts again now.

        While consumers are attached the queue is in use; its countdown runs from the moment
        the last one leaves, so the gateway reports every detach.
        """
        lease = self._leases.get(queue.name)
        if lease is not None and self._queues.get(queue.name) is queue:
            lease.last_used = self.clock.now

    def start_expiry_clocks(self) -> None:
        """Start every x-expires countdown now, when the server starts serving.

        Queues recovered from the log or declared by the configuration count from the start,
        as RabbitMQ's queues count from their own start after a restart.
        """
        now = self.clock.now
        for lease in self._leases.values():
            lease.last_used = now

    def expire_unused(self) -> list[str]:
        """Delete every queue unused for its x-expires; return their names.

        Unused means no consumer attached and no :meth:`renew_lease` for that long; publishing
        does not count, as in RabbitMQ. Messages go with the queue, not to its dead-letter exchange.
        """
        if not self._leases:
            return []
        now = self.clock.now
        expired: list[str] = []
        for name, lease in list(self._leases.items()):
            if lease.deadline > now:
                continue
            if self._queues[name].statistics().consumers:
                # In use: its countdown starts again when the last consumer leaves.
                lease.last_used = now
                continue
            self.delete_queue(name)
            expired.append(name)
        return expired


def _check_exchange(name: str, current: ExchangeSettings, wanted: ExchangeSettings) -> None:
    for field in ("type", "durable", "auto_delete", "internal", "alternate_exchange", "unroutable"):
        old, new = getattr(current, field), getattr(wanted, field)
        if old != new:
            raise PreconditionFailed(
                f"inequivalent arg '{field}' for exchange '{name}': received {new} "
                f"but current is {old}"
            )


__all__ = [
    "QUEUE_FACTORIES",
    "QUEUE_TYPES",
    "AccessRefused",
    "QueueContext",
    "QueueInfo",
    "QueueRegistry",
    "QueueSettings",
]


def _loggable(arguments: Mapping[str, object] | None) -> Arguments:
    """Declaration arguments as the log stores them: AMQP values under string keys.

    Arguments come from AMQP (management requests, link properties) or TOML definitions,
    so they are scalars, lists or maps of those; anything else has no AMQP encoding.
    """
    logged: Arguments = {}
    for key, value in (arguments or {}).items():
        if not _is_value(value):
            raise PreconditionFailed(f"argument '{key}' has no AMQP encoding: {value!r}")
        logged[key] = cast(Value, value)
    return logged


def _is_value(value: object) -> bool:
    if value is None or isinstance(value, str | bytes | bool | int | float):
        return True
    if isinstance(value, list):
        return all(_is_value(item) for item in value)
    if isinstance(value, dict):
        return all(_is_value(k) and _is_value(v) for k, v in value.items())
    return False
