"""Paging: a durable queue keeps the tail of a large backlog as compact pages, not messages.

A message object with its index entry costs some 450 bytes of memory, so a backlog of small
messages would need several times its own size in RAM. A queue with a :class:`Pager` keeps at
most :data:`RESIDENT_READY` ready messages as objects; what arrives beyond that goes to pages at
the tail, in order. A persistent message's page keeps only where its record lies in the log
(a few bytes); a transient one's page keeps the message itself, so that the order holds.
Pages are read back (paged in), head first, when a consumer's cursor reaches the end of the
resident messages or the head page's first message is due to expire.

Paged messages have no sequence number yet: the queue gives them the next ones as they are
paged in, so the resident messages stay one contiguous run of the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message

# Ready messages a paging queue keeps as objects before it pages new ones. A consumer granting
# credit in batches of a few hundred never waits for a page-in, and at ~450 bytes a message
# this is ~2 MB per queue whatever its backlog.
RESIDENT_READY: Final = 4096
# Messages per page: one page-in reads this many records with one read.
PAGE_MESSAGES: Final = 2048


class Page(Protocol):
    """A run of ready messages at a queue's tail, in order, not yet given sequence numbers."""

    @property
    def count(self) -> int:
        """Messages in the page."""

    @property
    def ready_bytes(self) -> int:
        """Their bytes on the wire."""

    @property
    def held(self) -> int:
        """Bytes the page counts against the memory budget."""

    def head_deadline(self, ttl: int | None) -> int | None:
        """When the first message expires under the queue's ``x-message-ttl``, if known."""

    def tail_deadline(self, ttl: int | None) -> int | None:
        """When every message has expired under ``x-message-ttl``, if that is known unread."""

    def take(self, ttl: int | None) -> Sequence[Message]:
        """The messages as objects, in order, with their expiry under ``ttl`` applied."""

    def drop(self) -> None:
        """Archive every message without reading it (a purge or a queue deletion)."""


class Pager(Protocol):
    """Makes pages for one queue."""

    def append(self, tail: Page | None, message: Message) -> Page | None:
        """Add ``message`` to ``tail`` and return None, or return a new page holding it."""


class MemoryPage:
    """Messages that are not in the log, kept as they are so that the queue's order holds."""

    __slots__ = ("held", "messages", "ready_bytes")

    def __init__(self, message: Message) -> None:
        # Each message counts its payload in full while paged, shared with a fan-out's other
        # copies or not (an upper bound, matched by its own refund): a page is counted as a
        # whole, and its messages join their share when paged in (queues/held_bytes.py).
        self.messages = [message]
        self.ready_bytes = message.read_size()
        self.held = message.held + MESSAGE_OVERHEAD

    @property
    def count(self) -> int:
        """Messages in the page."""
        return len(self.messages)

    def add(self, message: Message) -> bool:
        """Append ``message`` if the page has room."""
        if len(self.messages) >= PAGE_MESSAGES:
            return False
        self.messages.append(message)
        self.ready_bytes += message.read_size()
        self.held += message.held + MESSAGE_OVERHEAD
        return True

    def head_deadline(self, ttl: int | None) -> int | None:
        """The first message's expiry (the queue applied its TTL before paging it)."""
        return self.messages[0].expires

    def tail_deadline(self, ttl: int | None) -> int | None:
        """Not known without looking at each message: a memory page is paged in to expire."""
        return None

    def take(self, ttl: int | None) -> list[Message]:
        """The messages themselves."""
        return self.messages

    def drop(self) -> None:
        """Archive every message."""
        for message in self.messages:
            message.discard()


def append_in_memory(tail: Page | None, message: Message) -> Page | None:
    """Add ``message`` to ``tail`` if it is a memory page with room, else start one."""
    if isinstance(tail, MemoryPage) and tail.add(message):
        return None
    return MemoryPage(message)
