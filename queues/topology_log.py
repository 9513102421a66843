"""What the registry tells the durable log about queues, exchanges and bindings (DESIGN §3).

Durable declarations are logged so that recovery rebuilds them; the store
(:class:`queues.log.store.MessageStore`) implements this. Message state changes need no call
from the queues: a stored message logs its own (:class:`queues.log.store.StoredMessage`).
The registry also logs the dead-letter copies it makes of persistent messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from sluicegate.queues.log.records import Arguments
from sluicegate.queues.message import Message
from sluicegate.queues.paging import Pager
from sluicegate.queues.stream import StreamEntries


class TopologyLog(Protocol):
    """The store as the registry sees it."""

    def declare_queue(self, name: str, arguments: Arguments) -> None:
        """A durable queue exists with these arguments."""

    def pager(self, queue: str) -> Pager:
        """Pages for a durable queue's backlog beyond its resident messages."""

    def stream_entries(self, queue: str) -> StreamEntries:
        """Where a durable stream keeps its messages: their positions in the log."""

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
    ) -> Message:
        """Log a persistent message (a dead-letter copy) to a durable queue."""
