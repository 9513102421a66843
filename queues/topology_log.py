"""What the registry tells the durable log about queues, exchanges and bindings.

Durable declarations are logged so that recovery rebuilds them (docs/durability.md); the store
(:class:`queues.log.store.MessageStore`) implements this. A queue changes a message's state by
explicit calls (``acquire``, ``archive``, ``release``, ``discard``), which a stored message
logs (:class:`queues.log.stored.StoredMessage`); its body is read by an explicit ``read()``.
Dead-lettering logs the copies it makes of persistent messages (:mod:`queues.dead_lettering`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, cast

from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.log.records import Arguments
from sluicegate.queues.message import Message
from sluicegate.queues.storage import QueueStore
from sluicegate.wire.amqp_types import Value


class TopologyLog(QueueStore, Protocol):
    """The store as the registry sees it."""

    def declare_queue(self, name: str, arguments: Arguments) -> None:
        """A durable queue exists with these arguments."""

    def delete_queue(self, name: str, messages: Iterable[Message]) -> None:
        """A durable queue is gone, with ``messages`` it still held."""

    def declare_exchange(
        self,
        name: str,
        kind: str,
        arguments: Arguments,
        *,
        auto_delete: bool = False,
        internal: bool = False,
    ) -> None:
        """A durable exchange exists, with the flags its declaration fixed."""

    def delete_exchange(self, name: str) -> None:
        """A durable exchange is gone."""

    def bind(
        self,
        exchange: str,
        destination: str,
        key: str,
        arguments: Arguments,
        *,
        to_exchange: bool = False,
    ) -> None:
        """A binding between durable ends (a queue, or ``to_exchange`` an exchange) exists."""

    def unbind(
        self,
        exchange: str,
        destination: str,
        key: str,
        arguments: Arguments,
        *,
        to_exchange: bool = False,
    ) -> None:
        """A binding is gone."""

    def enqueue(
        self,
        queue: str,
        payload: bytes,
        timestamp: int,
        expires: int | None = None,
        *,
        exchange: str = "",
        routing_key: str = "",
        delivery_count: int = 0,
    ) -> Message:
        """Log a persistent message (a dead-letter copy) to a durable queue."""


def loggable(arguments: Mapping[str, object] | None) -> Arguments:
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
