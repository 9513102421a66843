"""Queues, exchanges and bindings declared by the configuration file, at start.

```toml
[[queues]]
name = "orders"
arguments = { "x-message-ttl" = 60000, "x-dead-letter-exchange" = "dlx" }

[[exchanges]]
name = "events"
type = "topic"

[[bindings]]
source = "events"
destination = "orders"
binding_key = "order.*"
```

Each entry is checked when the configuration loads (unknown keys, RabbitMQ's argument rules,
bindings naming what exists), so a mistake stops the server with one line naming the entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from sluicegate.gateway.rules.auth import DEFAULT_VHOST
from sluicegate.queues.errors import NotFound, PreconditionFailed
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.errors import AmqpError


class DefinitionError(ValueError):
    """A definition that cannot be declared; the message names the entry."""


@dataclass(frozen=True, slots=True)
class QueueDefinition:
    """A ``[[queues]]`` entry."""

    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: Mapping[str, object] = field(default_factory=dict)
    # The virtual host it is declared in, as in RabbitMQ's definitions.
    vhost: str = DEFAULT_VHOST


@dataclass(frozen=True, slots=True)
class ExchangeDefinition:
    """An ``[[exchanges]]`` entry."""

    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Mapping[str, object] = field(default_factory=dict)
    vhost: str = DEFAULT_VHOST


@dataclass(frozen=True, slots=True)
class BindingDefinition:
    """A ``[[bindings]]`` entry: a queue (or an exchange) bound to an exchange."""

    source: str
    destination: str
    binding_key: str = ""
    arguments: Mapping[str, object] = field(default_factory=dict)
    # RabbitMQ's definitions' name for what ``destination`` names: "queue" or "exchange".
    destination_type: str = "queue"
    vhost: str = DEFAULT_VHOST


_KINDS: Final = {
    "queues": QueueDefinition,
    "exchanges": ExchangeDefinition,
    "bindings": BindingDefinition,
}


def parse_definitions(
    key: str, raw: object
) -> tuple[QueueDefinition, ...] | tuple[ExchangeDefinition, ...] | tuple[BindingDefinition, ...]:
    """Read one ``[[queues]]``/``[[exchanges]]``/``[[bindings]]`` array of tables."""
    kind = _KINDS[key]
    if not isinstance(raw, list):
        raise DefinitionError(f"{key}: expected an array of tables ([[{key}]])")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    entries = []
    for index, entry in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict):
            raise DefinitionError(f"{where}: expected a table")
        values: dict[str, object] = {}
        for name, value in entry.items():
            attribute = name.replace("-", "_")
            if attribute not in fields:
                raise DefinitionError(f"{where}: unknown key '{name}'")
            expected = _TYPES[str(fields[attribute].type)]
            if not isinstance(value, expected) or (expected is str and isinstance(value, bool)):
                raise DefinitionError(f"{where}.{name}: expected {expected.__name__}")
            values[attribute] = value
        missing = [
            name
            for name, f in fields.items()
            if name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise DefinitionError(f"{where}: missing {', '.join(missing)}")
        entries.append(kind(**values))
    return tuple(entries)


_TYPES: Final[dict[str, type]] = {"str": str, "bool": bool, "Mapping[str, object]": dict}


def check_definitions(
    queues: tuple[QueueDefinition, ...],
    exchanges: tuple[ExchangeDefinition, ...],
    bindings: tuple[BindingDefinition, ...],
    vhosts: Iterable[str] = (DEFAULT_VHOST,),
) -> None:
    """Declare everything into scratch registries: what fails there would fail at start."""
    try:
        scratch = {vhost: QueueRegistry() for vhost in vhosts}
        apply_definitions(scratch, queues, exchanges, bindings)
    except AmqpError as error:
        raise DefinitionError(str(error)) from None


def apply_definitions(
    registries: Mapping[str, QueueRegistry],
    queues: tuple[QueueDefinition, ...],
    exchanges: tuple[ExchangeDefinition, ...],
    bindings: tuple[BindingDefinition, ...],
) -> None:
    """Declare the configured queues, then exchanges, then bindings, each in its vhost."""
    where = ""

    def registry_of(
        definition: QueueDefinition | ExchangeDefinition | BindingDefinition,
    ) -> QueueRegistry:
        registry = registries.get(definition.vhost)
        if registry is None:
            raise NotFound(
                f"no virtual host '{definition.vhost}' (declare it with a "
                f"[vhosts.{definition.vhost}] table)"
            )
        return registry

    try:
        for index, queue in enumerate(queues):
            where = f"queues[{index}] '{queue.name}'"
            registry_of(queue).declare_queue(
                queue.name, queue.arguments, durable=queue.durable, auto_delete=queue.auto_delete
            )
        for index, exchange in enumerate(exchanges):
            where = f"exchanges[{index}] '{exchange.name}'"
            registry_of(exchange).declare_exchange(
                exchange.name,
                exchange.type,
                durable=exchange.durable,
                auto_delete=exchange.auto_delete,
                internal=exchange.internal,
                arguments=exchange.arguments,
            )
        for index, binding in enumerate(bindings):
            where = f"bindings[{index}]"
            if binding.destination_type not in ("queue", "exchange"):
                raise PreconditionFailed(
                    f"destination_type must be 'queue' or 'exchange', not "
                    f"'{binding.destination_type}'"
                )
            registry_of(binding).bind(
                binding.source,
                binding.destination,
                binding.binding_key,
                binding.arguments,
                to_exchange=binding.destination_type == "exchange",
            )
    except AmqpError as error:
        raise type(error)(f"{where}: {error}") from None
