"""Exchanges: where a published message goes by its routing key (RabbitMQ's model).

An exchange routes to the queues bound to it: ``fanout`` to all, ``direct`` to those bound with
exactly the routing key, ``topic`` to those whose binding key matches the dot-separated routing
key, ``*`` standing for one word and ``#`` for zero or more. Direct routing is one dict lookup;
topic routing matches each distinct binding key once per message.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from queues.errors import NotImplementedByServer, PreconditionFailed


class ExchangeType(enum.Enum):
    """The exchange types served."""

    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"


class Unroutable(enum.Enum):
    """The outcome a publisher gets for a message no queue takes (``x-unroutable``)."""

    RELEASE = "release"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Binding:
    """A route from an exchange to a queue for one binding key."""

    source: str
    destination: str
    binding_key: str
    arguments: tuple[tuple[str, object], ...] = ()


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
        if type_name in ("headers", "x-consistent-hash", "x-local-random"):
            raise NotImplementedByServer(f"exchange type '{type_name}' is not supported") from None
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
        else:
            raise PreconditionFailed(f"invalid arg '{name}': unknown exchange argument")
    return ExchangeSettings(kind, durable, auto_delete, internal, alternate, unroutable)


def topic_matches(binding_key: str, routing_key: str) -> bool:
    """AMQP 0-9-1 topic matching: ``*`` is one word, ``#`` zero or more words."""
    return _match(binding_key.split("."), 0, routing_key.split("."), 0)


def _match(pattern: list[str], p: int, words: list[str], w: int) -> bool:
    # Iterative glob matching with one backtrack point, the last ``#`` seen.
    star_p = -1
    star_w = 0
    while w < len(words):
        if p < len(pattern) and pattern[p] == "#":
            star_p, star_w = p, w
            p += 1
        elif p < len(pattern) and pattern[p] in ("*", words[w]):
            p += 1
            w += 1
        elif star_p >= 0:
            star_w += 1
            p, w = star_p + 1, star_w
        else:
            return False
    while p < len(pattern) and pattern[p] == "#":
        p += 1
    return p == len(pattern)


class Exchange:
    """One exchange and its bindings."""

    __slots__ = ("_by_key", "bindings", "name", "settings")

    def __init__(self, name: str, settings: ExchangeSettings) -> None:
        self.name = name
        self.settings = settings
        self.bindings: dict[tuple[str, str], Binding] = {}
        # Destinations by binding key, kept for one-lookup direct routing.
        self._by_key: dict[str, dict[str, None]] = {}

    @property
    def type(self) -> ExchangeType:
        """The routing algorithm."""
        return self.settings.type

    def bind(self, binding: Binding) -> None:
        """Add a binding (idempotent)."""
        self.bindings[binding.destination, binding.binding_key] = binding
        self._by_key.setdefault(binding.binding_key, {})[binding.destination] = None

    def unbind(self, destination: str, binding_key: str) -> bool:
        """Remove a binding; False if there was none."""
        if self.bindings.pop((destination, binding_key), None) is None:
            return False
        destinations = self._by_key[binding_key]
        del destinations[destination]
        if not destinations:
            del self._by_key[binding_key]
        return True

    def unbind_destination(self, destination: str) -> bool:
        """Remove every binding to a queue that is being deleted; True if any went."""
        keys = [k for k in self.bindings if k[0] == destination]
        for key in keys:
            self.unbind(*key)
        return bool(keys)

    def route(self, routing_key: str) -> Iterable[str]:
        """The names of the queues a message with ``routing_key`` goes to."""
        kind = self.settings.type
        if kind is ExchangeType.DIRECT:
            return self._by_key.get(routing_key, ())
        if kind is ExchangeType.FANOUT:
            return dict.fromkeys(destination for destination, _ in self.bindings)
        found: dict[str, None] = {}
        for key, destinations in self._by_key.items():
            if topic_matches(key, routing_key):
                found.update(destinations)
        return found
