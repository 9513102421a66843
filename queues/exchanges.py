"""Exchanges: where a published message goes by its routing key or headers (RabbitMQ's model).

An exchange routes to the queues and exchanges bound to it: ``fanout`` to all, ``direct`` to
those bound with exactly the routing key, ``topic`` to those whose binding key matches the
dot-separated routing key, ``*`` standing for one word and ``#`` for zero or more (matched over a
trie of the binding keys, :mod:`queues.topic_trie`), ``headers`` to
those whose binding arguments match the message's headers (:mod:`queues.headers`),
``x-local-random`` (built into RabbitMQ 4.0) to one of its queues picked at random,
``x-consistent-hash`` (RabbitMQ's plugin) to one destination picked by a hash of the routing
key on a ring where each binding has as many points as its binding key says. Direct
routing is one dict lookup; topic routing walks the trie once per routing key, headers routing
matches each distinct set of binding arguments.

A binding is identified by its source, destination (a queue, or an exchange for an
exchange-to-exchange binding), binding key and arguments, as in RabbitMQ: two bindings that
differ only by their arguments are two bindings.
"""

from __future__ import annotations

import bisect
import enum
import random
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, cast

from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.headers import Headers, HeadersMatch, headers_match
from sluicegate.queues.route_steps import Take
from sluicegate.queues.topic_trie import TopicTrie
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.encoding import encode_canonical


class ExchangeType(enum.Enum):
    """The exchange types served."""

    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"
    # One bound queue, picked at random per message: RabbitMQ's request-reply load spreading,
    # where every queue is local on a single node.
    LOCAL_RANDOM = "x-local-random"
    # One destination per routing key, by a hash ring weighted by the binding keys: RabbitMQ's
    # consistent-hash exchange plugin, for spreading keys over queues stably.
    CONSISTENT_HASH = "x-consistent-hash"


# The exchange types whose routing ignores the routing key: a message is routed through them
# once for all its keys (queues/exchange_graph.py).
_UNKEYED: Final = frozenset({ExchangeType.FANOUT, ExchangeType.HEADERS, ExchangeType.LOCAL_RANDOM})

# Points a consistent-hash binding may put on its exchange's ring (its binding key), and all
# its bindings together: the ring is rebuilt when a binding changes and searched per message,
# so what a client can make it hold is capped. RabbitMQ's guides use weights of 1 to 20.
MAX_HASH_WEIGHT: Final = 1000
MAX_HASH_POINTS: Final = 20_000


class Unroutable(enum.Enum):
    """The outcome a publisher gets for a message no queue takes (``x-unroutable``)."""

    RELEASE = "release"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Binding:
    """A route from an exchange to a queue (or to an exchange) for one binding key."""

    source: str
    destination: str
    binding_key: str
    arguments: tuple[tuple[str, object], ...] = ()
    # An exchange-to-exchange binding: ``destination`` names an exchange.
    to_exchange: bool = False

    @property
    def key(self) -> BindingKey:
        """What identifies the binding among its source's."""
        return (self.to_exchange, self.destination, self.binding_key, self.arguments_identity)

    @property
    def arguments_identity(self) -> bytes:
        """The arguments' canonical encoding: equal arguments, equal bytes."""
        return canonical_arguments(dict(self.arguments))


# A binding among its source's: to an exchange?, destination, binding key, arguments' identity.
BindingKey = tuple[bool, str, str, bytes]


def canonical_arguments(arguments: Mapping[str, object]) -> bytes:
    """Binding arguments' identity (they are AMQP values: the registry checks them first)."""
    mapping: dict[Value, Value] = {k: cast(Value, v) for k, v in arguments.items()}
    return encode_canonical(mapping)


# Exchange arguments served: where unroutable messages go, and what the publisher is told.
ALTERNATE_EXCHANGE: Final = "alternate-exchange"
UNROUTABLE: Final = "x-unroutable"


@dataclass(frozen=True, slots=True)
class ExchangeSettings:
    """What a declaration fixes about an exchange; a redeclaration must repeat it."""

    type: ExchangeType
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    alternate_exchange: str | None = None
    unroutable: Unroutable = Unroutable.RELEASE
    # Every argument as declared, reported back; RabbitMQ compares only alternate-exchange
    # on a redeclaration and keeps arguments it does not know.
    arguments: tuple[tuple[str, object], ...] = field(default=(), compare=False)


def exchange_settings(
    type_name: str,
    *,
    durable: bool = True,
    auto_delete: bool = False,
    internal: bool = False,
    arguments: Mapping[str, object] | None = None,
) -> ExchangeSettings:
    """Validate an exchange declaration."""
    try:
        kind = ExchangeType(type_name)
    except ValueError:
        raise PreconditionFailed(f"invalid exchange type '{type_name}'") from None
    alternate: str | None = None
    unroutable = Unroutable.RELEASE
    for name, value in (arguments or {}).items():
        if name == ALTERNATE_EXCHANGE:
            if not isinstance(value, str):
                raise PreconditionFailed(f"invalid arg '{name}': expected a string")
            alternate = value
        elif name == UNROUTABLE:
            try:
                unroutable = Unroutable(value)
            except ValueError:
                raise PreconditionFailed(
                    f"invalid arg '{name}': expected 'release' or 'reject'"
                ) from None
    return ExchangeSettings(
        kind,
        durable,
        auto_delete,
        internal,
        alternate,
        unroutable,
        tuple(sorted((arguments or {}).items())),
    )


class _Routes:
    """Destinations of one kind (queues or exchanges), by what selects them.

    The selector is the binding key, or for a headers exchange the arguments' identity.
    Destinations are counted, since several bindings (differing by key or arguments) can
    route to the same one.
    """

    __slots__ = ("by_selector", "everywhere", "picks", "ring", "topics")

    def __init__(self, topics: TopicTrie | None) -> None:
        self.by_selector: dict[str | bytes, dict[str, int]] = {}
        # Every destination, for fanout routing and for "routes anywhere at all".
        self.everywhere: dict[str, int] = {}
        # A topic exchange's binding keys, matched once per routing key.
        self.topics = topics
        # A consistent-hash exchange's ring (sorted points, their destinations), made on the
        # first message after its bindings change.
        self.ring: tuple[list[int], list[str]] | None = None
        # An x-local-random exchange's destinations to pick from, made on the first message
        # after its bindings change: a list of them per message cost O(bindings) a message.
        self.picks: tuple[str, ...] | None = None

    def add(self, selector: str | bytes, destination: str) -> None:
        destinations = self.by_selector.get(selector)
        if destinations is None:
            destinations = self.by_selector[selector] = {}
            if self.topics is not None:
                self.topics.add(cast(str, selector))
        destinations[destination] = destinations.get(destination, 0) + 1
        self.everywhere[destination] = self.everywhere.get(destination, 0) + 1
        self.ring = self.picks = None

    def remove(self, selector: str | bytes, destination: str) -> None:
        destinations = self.by_selector[selector]
        _decrement(destinations, destination)
        if not destinations:
            del self.by_selector[selector]
            if self.topics is not None:
                self.topics.remove(cast(str, selector))
        _decrement(self.everywhere, destination)
        self.ring = self.picks = None

    def points(self) -> int:
        """The points a consistent-hash exchange's bindings put on its ring."""
        return sum(
            int(weight) * sum(destinations.values())
            for weight, destinations in self.by_selector.items()
        )

    def _hashed(self, routing_key: str) -> Iterable[str]:
        ring = self.ring
        if ring is None:
            points = sorted(
                (_hash(f"{destination}\0{point}"), destination)
                for weight, destinations in self.by_selector.items()
                for destination, count in destinations.items()
                for point in range(int(weight) * count)
            )
            ring = self.ring = ([p for p, _ in points], [d for _, d in points])
        hashes, names = ring
        if not hashes:
            return ()
        at = bisect.bisect_left(hashes, _hash(routing_key))
        return (names[at % len(names)],)

    def route(
        self, kind: ExchangeType, routing_key: str, take: Take | None = None
    ) -> Iterable[str]:
        if kind is ExchangeType.DIRECT:
            return self.by_selector.get(routing_key, ())
        if kind is ExchangeType.FANOUT:
            return self.everywhere
        if kind is ExchangeType.LOCAL_RANDOM:
            picks = self.picks
            if picks is None:
                picks = self.picks = tuple(self.everywhere)
            return (random.choice(picks),) if picks else ()
        if kind is ExchangeType.CONSISTENT_HASH:
            return self._hashed(routing_key)
        topics = self.topics
        if topics is None:
            return ()
        by_selector = self.by_selector
        found: dict[str, int] = {}
        for key in topics.match(routing_key, take):
            found.update(by_selector[key])
        return found

    def route_headers(self, patterns: dict[bytes, HeadersMatch], headers: Headers) -> list[str]:
        found: dict[str, int] = {}
        for identity, destinations in self.by_selector.items():
            if patterns[cast(bytes, identity)].matches(headers):
                found.update(destinations)
        return list(found)


def _hash(text: str) -> int:
    """A hash that is the same in every process and after a restart (``hash()`` is not)."""
    return zlib.crc32(text.encode())


def _decrement(counts: dict[str, int], name: str) -> None:
    left = counts[name] - 1
    if left:
        counts[name] = left
    else:
        del counts[name]


class Exchange:
    """One exchange and its bindings."""

    __slots__ = (
        "_exchanges",
        "_patterns",
        "_queues",
        "bindings",
        "keyed",
        "name",
        "plain",
        "settings",
    )

    def __init__(self, name: str, settings: ExchangeSettings) -> None:
        self.name = name
        self.settings = settings
        self.bindings: dict[BindingKey, Binding] = {}
        topic = settings.type is ExchangeType.TOPIC
        self._queues = _Routes(TopicTrie() if topic else None)
        self._exchanges = _Routes(TopicTrie() if topic else None)
        # A headers exchange's compiled binding arguments, by their identity.
        self._patterns: dict[bytes, HeadersMatch] = {}
        # Routes by routing key to queues only: the registry's one-step path.
        self.plain = settings.type is not ExchangeType.HEADERS
        # Whether where a message goes depends on its routing key: a fanout, headers or
        # local-random exchange routes every key of a message alike (queues/exchange_graph.py
        # walks it once for all of them).
        self.keyed = settings.type not in _UNKEYED

    @property
    def type(self) -> ExchangeType:
        """The routing algorithm."""
        return self.settings.type

    def check(self, binding_key: str, arguments: Mapping[str, object], queue_type: str) -> None:
        """Refuse a binding this exchange's type refuses: a headers exchange's bad ``x-match``,
        or for ``x-local-random`` (as RabbitMQ) a binding key or a destination other than a
        classic queue (``queue_type`` is empty for an exchange)."""
        kind = self.settings.type
        if kind is ExchangeType.HEADERS:
            headers_match(arguments)
        elif kind is ExchangeType.CONSISTENT_HASH:
            if not queue_type:
                raise PreconditionFailed(
                    "an x-consistent-hash exchange binds queues only: its ring picks one of them"
                )
            self._check_weight(binding_key)
        elif kind is ExchangeType.LOCAL_RANDOM:
            if binding_key:
                raise PreconditionFailed(
                    f"binding key '{binding_key}' not permitted on an x-local-random exchange"
                )
            if queue_type != "classic":
                raise PreconditionFailed(
                    "an x-local-random exchange binds only classic queues, not "
                    + (f"a {queue_type} queue" if queue_type else "exchanges")
                )

    def _check_weight(self, binding_key: str) -> None:
        """A consistent-hash binding's key is its weight, an integer (RabbitMQ's rule), and the
        ring it adds to stays within its bound."""
        if not binding_key.isascii() or not binding_key.isdigit() or not binding_key.strip("0"):
            raise PreconditionFailed(
                f"binding key '{binding_key}' must be a positive integer: a consistent-hash "
                "binding's key is its weight"
            )
        weight = int(binding_key)
        if weight > MAX_HASH_WEIGHT:
            raise PreconditionFailed(
                f"binding key {weight} is over the {MAX_HASH_WEIGHT} points a binding may have"
            )
        if self._queues.points() + self._exchanges.points() + weight > MAX_HASH_POINTS:
            raise PreconditionFailed(
                f"exchange '{self.name}' would have over {MAX_HASH_POINTS} points on its ring"
            )

    def bind(self, binding: Binding) -> bool:
        """Add a binding; False if it existed."""
        key = binding.key
        if key in self.bindings:
            return False
        self.bindings[key] = binding
        routes = self._exchanges if binding.to_exchange else self._queues
        routes.add(self._selector(binding, key[3]), binding.destination)
        self._update_plain()
        return True

    def unbind(self, key: BindingKey) -> Binding | None:
        """Remove the binding ``key`` names; None if there was none."""
        binding = self.bindings.pop(key, None)
        if binding is None:
            return None
        routes = self._exchanges if binding.to_exchange else self._queues
        selector = key[3] if self.settings.type is ExchangeType.HEADERS else binding.binding_key
        routes.remove(selector, binding.destination)
        if isinstance(selector, bytes) and selector not in routes.by_selector:
            other = self._queues if routes is self._exchanges else self._exchanges
            if selector not in other.by_selector:
                del self._patterns[selector]
        self._update_plain()
        return binding

    def unbind_destination(self, destination: str, *, to_exchange: bool = False) -> list[Binding]:
        """Remove every binding to a queue (or an exchange) that is being deleted."""
        keys = [k for k in self.bindings if k[1] == destination and k[0] is to_exchange]
        removed = [self.unbind(key) for key in keys]
        return [binding for binding in removed if binding is not None]

    def _selector(self, binding: Binding, identity: bytes) -> str | bytes:
        if self.settings.type is not ExchangeType.HEADERS:
            return binding.binding_key
        if identity not in self._patterns:
            self._patterns[identity] = headers_match(dict(binding.arguments))
        return identity

    def _update_plain(self) -> None:
        self.plain = self.settings.type is not ExchangeType.HEADERS and not (
            self._exchanges.everywhere
        )

    def route(self, routing_key: str, take: Take | None = None) -> Iterable[str]:
        """The names of the queues a message with ``routing_key`` goes to (not headers)."""
        return self._queues.route(self.settings.type, routing_key, take)

    def route_exchanges(self, routing_key: str, take: Take | None = None) -> Iterable[str]:
        """The names of the exchanges a message with ``routing_key`` goes on to (not headers)."""
        return self._exchanges.route(self.settings.type, routing_key, take)

    def patterns(self) -> int:
        """The binding patterns a headers exchange matches a message's headers against."""
        return len(self._queues.by_selector) + len(self._exchanges.by_selector)

    def onward(self, queues: Iterable[str], exchanges: Iterable[str]) -> Iterable[str]:
        """Where a message this exchange routed to ``queues`` and ``exchanges`` goes on: those
        exchanges, or its alternate exchange when it routed it nowhere (as in RabbitMQ)."""
        if queues or exchanges:
            return exchanges
        alternate = self.settings.alternate_exchange
        return () if alternate is None else (alternate,)

    def route_headers(self, headers: Headers) -> tuple[list[str], list[str]]:
        """The queues and the exchanges a message with ``headers`` goes to (headers only)."""
        patterns = self._patterns
        return (
            self._queues.route_headers(patterns, headers),
            self._exchanges.route_headers(patterns, headers),
        )
