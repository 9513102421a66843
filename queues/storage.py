"""What a queue type keeps in the durable store, as queue types see the store.

Storage is a capability of a queue type: the registry hands a durable queue the store once
(:meth:`queues.queue_type.QueueType.attach_store`) and, after a restart, asks it to take back
what recovery found (:meth:`~queues.queue_type.QueueType.restore`). A classic queue keeps its
backlog beyond its resident messages in pages (:mod:`queues.paging`); a stream keeps log
positions (:class:`StreamEntries`). :class:`queues.log.store.MessageStore` implements both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from sluicegate.queues.message import Message
from sluicegate.queues.paging import Page, Pager

if TYPE_CHECKING:
    from sluicegate.queues.log.stored import StoredMessage


class StreamEntries(Protocol):
    """A stream's messages by index from its first offset: in memory, or as log positions."""

    def __len__(self) -> int:
        """Messages held."""

    def __getitem__(self, index: int) -> Message:
        """The message at ``index``, to deliver."""

    def take(self, index: int, count: int, seq: int) -> list[Message]:
        """The ``count`` messages from ``index`` on, to deliver, numbered ``seq`` on."""

    def append(self, message: Message) -> int:
        """Add the newest message; return the bytes it counts against the memory budget."""

    def size(self, index: int) -> int:
        """The message's bytes on the wire."""

    def sizes(self, start: int, stop: int) -> Sequence[int]:
        """The bytes on the wire of the messages at ``[start, stop)``."""

    def drop(self, index: int) -> int:
        """Archive the message (retention or a purge); return the bytes it counted."""

    def emptied(self, offset: int) -> None:
        """Every message was dropped: the next one gets ``offset``, after a restart too."""

    def resumed_offset(self) -> int:
        """The offset the stream went on at when it last held no message (0 if it never did),
        for a restore that finds none."""

    def trim(self, count: int) -> None:
        """Forget the first ``count`` messages, dropped before."""


class QueueStore(Protocol):
    """The store's side of a durable queue."""

    def pager(self, queue: str) -> Pager:
        """Pages for a durable classic queue's backlog beyond its resident messages."""

    def stream_entries(self, queue: str) -> StreamEntries:
        """Where a durable stream keeps its messages: their positions in the log."""

    def take_recovered(self, queue: str) -> Sequence[Page]:
        """Pages of the messages recovery found in ``queue``, in log order, once."""

    def iter_recovered_messages(self, queue: str) -> Iterator[StoredMessage]:
        """The messages recovery found in ``queue``, read a page at a time."""
