"""The exchange graph: exchanges, the bindings between them and to queues, and routing over it.

The default exchange ``""`` routes to the queue named by the routing key; ``amq.direct``,
``amq.fanout``, ``amq.topic``, ``amq.headers`` and ``amq.match`` exist from the start, as in
RabbitMQ. A message published to an exchange goes to the queues its bindings select, on through
exchange-to-exchange bindings, and to an exchange's alternate exchange when nothing takes it.
Durable exchanges, and bindings whose both ends are durable, are logged.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from collections.abc import Set as AbstractSet
from itertools import repeat
from typing import Final

from sluicegate.queues.errors import AccessRefused, NotFound, PreconditionFailed
from sluicegate.queues.exchanges import (
    Binding,
    Exchange,
    ExchangeSettings,
    ExchangeType,
    exchange_settings,
)
from sluicegate.queues.headers import Headers, routing_headers
from sluicegate.queues.log.records import Arguments
from sluicegate.queues.queue_homes import Placement
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.route_steps import RouteSteps
from sluicegate.queues.topology_log import TopologyLog, loggable

DEFAULT_EXCHANGE: Final = ""
PREDECLARED: Final = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}


class ExchangeGraph:
    """Every exchange and binding of one server, routing to the queues it is given."""

    def __init__(
        self,
        queues: Mapping[str, QueueType],
        logged_queues: Container[str],
        queue_type: Callable[[str], str],
        store: TopologyLog | None,
    ) -> None:
        # The server's queues by name, those whose declarations are logged, and the type of
        # the queue a name names (raising amqp:not-found for none): the registry's.
        self._queues = queues
        self._logged_queues = logged_queues
        self._queue_type = queue_type
        self.store = store
        self._exchanges: dict[str, Exchange] = {}
        # Bindings of every exchange, kept as they come and go so a limit costs O(1).
        self.binding_count = 0
        # The exchanges bound to each destination (name, is it an exchange), with how many
        # bindings each: deleting a queue or exchange looks only at them, so a cascade of
        # auto-delete exchanges costs its length, not its length times every exchange.
        self._sources: dict[tuple[str, bool], dict[str, int]] = {}
        # Exchanges whose bindings to logged queues are logged: the durable ones.
        self._logged_exchanges: set[str] = set(PREDECLARED)
        # Set when the server runs on several workers: changes are told to the others.
        self.placement: Placement | None = None
        for name, kind in PREDECLARED.items():
            self._exchanges[name] = Exchange(name, exchange_settings(kind))

    # -- exchanges ------------------------------------------------------------------------

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
                loggable(arguments),
                auto_delete=auto_delete,
                internal=internal,
            )
            self._logged_exchanges.add(name)
        if self.placement is not None:
            self.placement.changed(
                ["exchange", name, type_name, loggable(arguments), durable, auto_delete, internal]
            )
        return exchange

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and its bindings (deleting one that does not exist succeeds).

        Its bindings as a source and as a destination go with it; a source left without
        bindings goes too if it is auto-delete, as in RabbitMQ.
        """
        if name == DEFAULT_EXCHANGE or name in PREDECLARED:
            raise AccessRefused(f"exchange '{name}' cannot be deleted")
        exchange = self._exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"exchange '{name}' in use")
        self._drop(exchange)
        self.remove_destination(name, to_exchange=True)
        if self.placement is not None:
            self.placement.changed(["delete-exchange", name])

    def _drop(self, exchange: Exchange) -> None:
        """Forget an exchange and its bindings as a source; bindings to it are not looked at."""
        name = exchange.name
        del self._exchanges[name]
        self.binding_count -= len(exchange.bindings)
        for binding in exchange.bindings.values():
            self._unindex(binding)
        if name in self._logged_exchanges and self.store is not None:
            self._logged_exchanges.discard(name)
            self.store.delete_exchange(name)

    def remove_destination(self, name: str, *, to_exchange: bool) -> None:
        """Remove every binding to a deleted queue or exchange, then auto-delete the emptied.

        An auto-delete exchange emptied so is deleted in turn, and so on down a chain a client
        built: with a work list, not by recursion, so a chain of any length cannot exhaust the
        stack half-way (and leave the graph half-deleted). The log needs no record per
        binding: recovery drops the bindings of whatever a deletion record names.
        """
        gone = [(name, to_exchange)]
        while gone:
            destination, is_exchange = gone.pop()
            for source in self._sources.pop((destination, is_exchange), {}):
                exchange = self._exchanges[source]
                removed = exchange.unbind_destination(destination, to_exchange=is_exchange)
                self.binding_count -= len(removed)
                if exchange.settings.auto_delete and not exchange.bindings:
                    self._drop(exchange)
                    gone.append((exchange.name, True))

    def exchange(self, name: str) -> Exchange:
        """Return the exchange called ``name``, or raise ``amqp:not-found``."""
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange '{name}'")
        return exchange

    def exchanges(self) -> list[Exchange]:
        """Every declared exchange, by name (the default exchange is implicit)."""
        return [self._exchanges[name] for name in sorted(self._exchanges)]

    @property
    def exchange_count(self) -> int:
        """How many exchanges were declared (the ``amq.*`` ones the server has are not)."""
        return len(self._exchanges) - len(PREDECLARED)

    def has_binding(
        self, source: str, destination: str, key: str, arguments: Mapping[str, object], kind: str
    ) -> bool:
        """Whether exactly this binding exists (binding it again would change nothing).

        ``kind`` is the destination's, ``queue`` or ``exchange``.
        """
        binding = _binding(source, destination, key, loggable(arguments), kind == "exchange")
        return self._existing(binding) is not None

    def _existing(self, binding: Binding) -> Exchange | None:
        """The source exchange of ``binding`` if it has exactly that binding."""
        exchange = self._exchanges.get(binding.source)
        return exchange if exchange is not None and binding.key in exchange.bindings else None

    # -- bindings -------------------------------------------------------------------------

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
            queue_type = self._queue_type(destination)
        logged = loggable(arguments)
        exchange.check(binding_key, logged, queue_type)
        binding = _binding(source, destination, binding_key, logged, to_exchange)
        if not exchange.bind(binding):
            return binding
        self.binding_count += 1
        sources = self._sources.setdefault((destination, to_exchange), {})
        sources[source] = sources.get(source, 0) + 1
        if (
            self.store is not None
            and source in self._logged_exchanges
            and destination in (self._logged_exchanges if to_exchange else self._logged_queues)
        ):
            self.store.bind(source, destination, binding_key, logged, to_exchange=to_exchange)
        if self.placement is not None:
            self.placement.changed(["bind", source, destination, binding_key, logged, to_exchange])
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
        logged = loggable(arguments)
        binding = _binding(source, destination, binding_key, logged, to_exchange)
        exchange = self._existing(binding)
        if exchange is None:
            return False
        exchange.unbind(binding.key)
        self.binding_count -= 1
        self._unindex(binding)
        if self.store is not None:
            self.store.unbind(source, destination, binding_key, logged, to_exchange=to_exchange)
        if self.placement is not None:
            self.placement.changed(
                ["unbind", source, destination, binding_key, logged, to_exchange]
            )
        self._auto_delete(exchange)
        return True

    def _unindex(self, binding: Binding) -> None:
        """``binding`` is gone: its source counts one binding less to its destination."""
        destination = (binding.destination, binding.to_exchange)
        sources = self._sources[destination]
        left = sources[binding.source] - 1
        if left:
            sources[binding.source] = left
        else:
            del sources[binding.source]
            if not sources:
                del self._sources[destination]

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

    # -- routing --------------------------------------------------------------------------

    def route(
        self, exchange: str, routing_key: str, payload: bytes | memoryview = b""
    ) -> list[QueueType]:
        """The queues a message published to ``exchange`` with ``routing_key`` goes to.

        ``payload`` is the encoded message, whose headers are read only if a headers exchange
        is on the way. An exchange that routes nowhere passes the message to its alternate
        exchange, if any. Raises ``amqp:not-found`` for an exchange that does not exist,
        ``amqp:decode-error`` for headers a headers exchange cannot read, and
        ``amqp:resource-limit-exceeded`` for a message whose routing would take more than
        ``MAX_ROUTE_STEPS`` (queues/route_steps.py).
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
        return self._route_through(found, (routing_key,), payload)

    def route_keys(
        self, exchange: str, routing_keys: Iterable[str], payload: bytes | memoryview = b""
    ) -> list[QueueType]:
        """The queues any of ``routing_keys`` reaches through ``exchange``, each once (a
        message's ``x-cc`` keys), in one walk of the exchanges for all of them; through the
        default exchange, each key by :meth:`route` (a subclass's too)."""
        if exchange == DEFAULT_EXCHANGE:
            reached = {id(q): q for key in routing_keys for q in self.route(exchange, key)}
            return list(reached.values())
        found = self._exchanges.get(exchange)
        if found is None:
            raise NotFound(f"no exchange '{exchange}'")
        return self._route_through(found, routing_keys, payload)

    def _route_through(
        self, start: Exchange, routing_keys: Iterable[str], payload: bytes | memoryview
    ) -> list[QueueType]:
        """Follow exchange-to-exchange bindings and alternate exchanges, each exchange once for
        each routing key that reaches it, within the steps a message may take
        (queues/route_steps.py).

        As in RabbitMQ, an exchange whose bindings take a key nowhere (no queue and no
        exchange) passes it to its alternate exchange; a queue reached several ways gets one
        copy, and a cycle of bindings ends where it meets an exchange already visited with that
        key. An exchange whose routing ignores the key (fanout, headers, local-random) is
        visited once for all the keys that reach it together, and the message's headers are
        read once, by the first headers exchange on the way: walked once per key, 256 ``x-cc``
        keys through a fanout bound to 2,000 exchanges took 368 ms of the reactor.
        """
        take = RouteSteps().take
        keys = frozenset(routing_keys)
        headers: Headers | None = None
        # The keys each exchange was visited with, and the visits still to make.
        visited: dict[str, AbstractSet[str]] = {start.name: keys}
        pending: list[tuple[Exchange, AbstractSet[str]]] = [(start, keys)]
        reached: dict[str, None] = {}
        exchanges = self._exchanges
        for exchange, with_keys in pending:
            onward: Iterable[tuple[str, AbstractSet[str]]]
            queues: Iterable[str]
            to: Iterable[str]
            if exchange.keyed:
                take(len(with_keys))
                going: dict[str, set[str]] = {}
                for key in with_keys:
                    queues = exchange.route(key, take)
                    to = () if exchange.plain else exchange.route_exchanges(key, take)
                    to = exchange.onward(queues, to)
                    reached.update(dict.fromkeys(queues))
                    for name in to:
                        going.setdefault(name, set()).add(key)
                onward = going.items()
            else:
                if exchange.type is ExchangeType.HEADERS:
                    take(exchange.patterns())
                    if headers is None:
                        headers = routing_headers(payload)
                    queues, to = exchange.route_headers(headers)
                else:
                    take(1)
                    queues = exchange.route("")
                    to = () if exchange.plain else exchange.route_exchanges("")
                to = exchange.onward(queues, to)
                if queues:
                    reached.update(dict.fromkeys(queues))
                onward = zip(to, repeat(with_keys)) if to else ()
            for name, arriving in onward:
                before = visited.get(name)
                if before is None:
                    following = exchanges.get(name)
                    if following is not None:
                        visited[name] = arriving
                        pending.append((following, arriving))
                    continue
                take(len(arriving))
                fresh = arriving - before
                if fresh:
                    visited[name] = before | fresh
                    pending.append((exchanges[name], fresh))
        found = self._queues
        return [found[q] for q in reached if q in found]


def _binding(
    source: str, destination: str, binding_key: str, logged: Arguments, to_exchange: bool
) -> Binding:
    return Binding(source, destination, binding_key, tuple(sorted(logged.items())), to_exchange)


def _check_exchange(name: str, current: ExchangeSettings, wanted: ExchangeSettings) -> None:
    for field in ("type", "durable", "auto_delete", "internal", "alternate_exchange", "unroutable"):
        old, new = getattr(current, field), getattr(wanted, field)
        if old != new:
            raise PreconditionFailed(
                f"inequivalent arg '{field}' for exchange '{name}': received {new} "
                f"but current is {old}"
            )
