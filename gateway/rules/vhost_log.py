"""The durable log shared by every virtual host: names qualified by their virtual host.

The log names queues and exchanges in every record that refers to one (declarations, bindings,
each persistent message), so a virtual host is part of the name the log sees: a queue ``q`` of
the default virtual host is logged as ``q``, exactly as before virtual hosts existed (a log
written by an older server is the default virtual host's), and a queue ``q`` of virtual host
``v`` as ``NUL v NUL q``. The mapping is one-to-one because neither a virtual host's name nor a
queue or exchange name may contain NUL (gateway/rules/names.py), and it costs a log record nothing
for the default virtual host.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from sluicegate.gateway.rules.auth import DEFAULT_VHOST
from sluicegate.queues.log.paged import DiskPage
from sluicegate.queues.log.records import Arguments
from sluicegate.queues.log.store import MessageStore
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.message import Message
from sluicegate.queues.paging import Pager
from sluicegate.queues.storage import StreamEntries

_MARK: Final = "\x00"


def logged_name(vhost: str, name: str) -> str:
    """The name the log knows a queue or exchange of ``vhost`` by."""
    if vhost == DEFAULT_VHOST:
        return name
    return f"{_MARK}{vhost}{_MARK}{name}"


def split_logged_name(logged: str) -> tuple[str, str]:
    """``(vhost, name)`` of a name as logged."""
    if not logged.startswith(_MARK):
        return DEFAULT_VHOST, logged
    vhost, _, name = logged[1:].partition(_MARK)
    return vhost, name


class VhostLog:
    """The store as one virtual host's registry sees it (its ``TopologyLog``)."""

    __slots__ = ("store", "vhost")

    def __init__(self, store: MessageStore, vhost: str) -> None:
        self.store = store
        self.vhost = vhost

    def name(self, name: str) -> str:
        """What the log calls this virtual host's ``name``."""
        return logged_name(self.vhost, name)

    def declare_queue(self, name: str, arguments: Arguments) -> None:
        """A durable queue exists with these arguments."""
        self.store.declare_queue(self.name(name), arguments)

    def pager(self, queue: str) -> Pager:
        """Pages for a durable queue's backlog beyond its resident messages."""
        return self.store.pager(self.name(queue))

    def stream_entries(self, queue: str) -> StreamEntries:
        """Where a durable stream keeps its messages: their positions in the log."""
        return self.store.stream_entries(self.name(queue))

    def take_recovered(self, queue: str) -> list[DiskPage]:
        """Pages of the messages recovery found in a durable classic queue, once."""
        return self.store.take_recovered(self.name(queue))

    def iter_recovered_messages(self, queue: str) -> Iterator[StoredMessage]:
        """The messages recovery found in a durable stream, read a page at a time."""
        return self.store.iter_recovered_messages(self.name(queue))

    def delete_queue(self, name: str, messages: Iterable[Message]) -> None:
        """A durable queue is gone, with ``messages`` it still held."""
        self.store.delete_queue(self.name(name), messages)

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
        self.store.declare_exchange(
            self.name(name), kind, arguments, auto_delete=auto_delete, internal=internal
        )

    def delete_exchange(self, name: str) -> None:
        """A durable exchange is gone."""
        self.store.delete_exchange(self.name(name))

    def bind(
        self,
        exchange: str,
        destination: str,
        key: str,
        arguments: Arguments,
        *,
        to_exchange: bool = False,
    ) -> None:
        """A binding between durable ends exists."""
        self.store.bind(
            self.name(exchange), self.name(destination), key, arguments, to_exchange=to_exchange
        )

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
        self.store.unbind(
            self.name(exchange), self.name(destination), key, arguments, to_exchange=to_exchange
        )

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
        """Log a persistent message (a dead-letter copy) to a durable queue.

        The exchange a message was published to is logged as its name in the virtual host:
        it is what dead-lettering and the message's annotations report, not a log reference.
        """
        return self.store.enqueue(
            self.name(queue),
            payload,
            timestamp,
            expires,
            exchange=exchange,
            routing_key=routing_key,
            delivery_count=delivery_count,
        )
