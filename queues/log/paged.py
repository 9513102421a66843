"""Pages of persistent messages: where their records lie in the log, eight bytes a message.

A :class:`DiskPage` holds a run of one queue's ready messages whose records are all in one
segment within :data:`PAGE_SPAN` bytes, so one read brings them back (``PageStore.page_in``).
It keeps each record's offset (u32) and message id (a u16 delta from the page's first id), and the
failed-delivery counts of the few messages that have any; everything else is in the records.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Final, Protocol

from sluicegate.queues.log.stored import MessageJournal, StoredMessage
from sluicegate.queues.message import Message
from sluicegate.queues.paging import PAGE_MESSAGES, Page, append_in_memory

# Bytes of log one page's records may spread over: the read at page-in. Other queues' records
# interleave with a queue's own; this bounds what a page-in reads that it does not need.
PAGE_SPAN: Final = 4 * 1024 * 1024
# What a paged message costs in memory, for the memory budget: a u32 and a u16 in arrays (6 B),
# and 2 B more measured (docs/bounds.md): CPython grows an array by a sixteenth beyond what it
# holds, each page has its objects (~300 B a 2,048 messages), and the arrays' reallocations
# leave the allocator holes. Measured 8.3 B a message of RSS in a server (300,000 paged 100-B
# messages, no body cache); counted 6, the budget missed a quarter of it.
PAGED_MESSAGE_BYTES: Final = 8
# The largest id delta a page holds. Ids are the log's (all queues share them), so a queue
# interleaved with many others gets shorter pages; one publishing alone fills them.
_MAX_DELTA: Final = 0xFFFF


class PageEntries:
    """Record offsets and id deltas of a run of one queue's messages in one segment."""

    __slots__ = (
        "end",
        "first_id",
        "first_timestamp",
        "ids",
        "last_timestamp",
        "offsets",
        "segment",
        "start",
    )

    def __init__(self, segment: int, start: int, first_id: int, first_timestamp: int) -> None:
        self.segment = segment
        # The span one read covers: from the first record's start to the last one's end.
        self.start = start
        self.end = start
        self.first_id = first_id
        self.first_timestamp = first_timestamp
        # The newest arrival: once it is past the queue's x-message-ttl, so is every message.
        self.last_timestamp = first_timestamp
        self.offsets = array("I")
        self.ids = array("H")

    @property
    def count(self) -> int:
        """Messages in the page."""
        return len(self.offsets)

    def fits(self, segment: int, end: int, message_id: int) -> bool:
        """True if a record of ``segment`` ending at ``end`` can join the page."""
        return (
            segment == self.segment
            and end - self.start <= PAGE_SPAN
            and len(self.offsets) < PAGE_MESSAGES
            and 0 <= message_id - self.first_id <= _MAX_DELTA
        )

    def message_ids(self) -> list[int]:
        """The messages' ids, in order."""
        first = self.first_id
        return [first + delta for delta in self.ids]

    def _append(self, offset: int, end: int, message_id: int, timestamp: int) -> None:
        self.last_timestamp = max(self.last_timestamp, timestamp)
        self.offsets.append(offset)
        self.ids.append(message_id - self.first_id)
        self.end = end


class PageStore(MessageJournal, Protocol):
    """What pages need of the store: reading them back, settling them, what they may hold."""

    def page_in(self, page: DiskPage, ttl: int | None) -> list[StoredMessage]:
        """The page's messages, read back."""

    def drop_page(self, page: DiskPage) -> None:
        """Settle the page's messages without reading them."""

    def paged_entry(self, message: Message) -> StoredMessage | None:
        """``message`` if a page can hold it as a record's position."""


class DiskPage(PageEntries):
    """Ready persistent messages of one queue, as record offsets in one segment."""

    __slots__ = ("failures", "queue", "ready_bytes", "store")

    def __init__(
        self,
        store: PageStore,
        queue: str,
        segment: int,
        start: int,
        first_id: int,
        first_timestamp: int,
    ) -> None:
        super().__init__(segment, start, first_id, first_timestamp)
        self.store = store
        self.queue = queue
        self.ready_bytes = 0
        # Index in the page → failed deliveries, for the messages that have any.
        self.failures: dict[int, int] | None = None

    @classmethod
    def of(
        cls, store: PageStore, queue: str, entries: PageEntries, sizes: Sequence[int]
    ) -> DiskPage:
        """A page of ``entries`` as they are (their arrays shared), of ``sizes`` bytes each."""
        page = cls(
            store, queue, entries.segment, entries.start, entries.first_id, entries.first_timestamp
        )
        page.end = entries.end
        page.last_timestamp = entries.last_timestamp
        page.offsets = entries.offsets
        page.ids = entries.ids
        page.ready_bytes = sum(sizes)
        return page

    @property
    def held(self) -> int:
        """Bytes counted against the memory budget."""
        return len(self.offsets) * PAGED_MESSAGE_BYTES

    def add(
        self, offset: int, end: int, message_id: int, size: int, failures: int, timestamp: int
    ) -> None:
        """Append a message whose record lies at ``offset`` up to ``end``, arrived then."""
        if failures:
            if self.failures is None:
                self.failures = {}
            self.failures[len(self.offsets)] = failures
        self._append(offset, end, message_id, timestamp)
        self.ready_bytes += size

    def head_deadline(self, ttl: int | None) -> int | None:
        """The first message's arrival plus the queue's TTL; its own expiry is seen at page-in."""
        return None if ttl is None else self.first_timestamp + ttl

    def tail_deadline(self, ttl: int | None) -> int | None:
        """When every message has expired under ``ttl``: the newest one's arrival plus it."""
        return None if ttl is None else self.last_timestamp + ttl

    def take(self, ttl: int | None) -> Sequence[Message]:
        """Read the messages back (one read of the page's span)."""
        return self.store.page_in(self, ttl)

    def drop(self) -> None:
        """Settle every message in the log without reading it."""
        self.store.drop_page(self)


class LogPager:
    """Pages for one durable queue: persistent messages by position, others in memory."""

    __slots__ = ("queue", "store")

    def __init__(self, store: PageStore, queue: str) -> None:
        self.store = store
        self.queue = queue

    def append(self, tail: Page | None, message: Message) -> Page | None:
        """Add ``message`` to ``tail`` if it is a page of its kind with room, else start one."""
        stored = self.store.paged_entry(message)
        if stored is None:
            return append_in_memory(tail, message)
        return self._append_stored(tail, stored)

    def _append_stored(self, tail: Page | None, message: StoredMessage) -> Page | None:
        start, end = message.record, message.record_end
        page: DiskPage | None = None
        if not (isinstance(tail, DiskPage) and tail.fits(message.segment, end, message.message_id)):
            tail = page = DiskPage(
                self.store,
                self.queue,
                message.segment,
                start,
                message.message_id,
                message.timestamp,
            )
        tail.add(
            start,
            end,
            message.message_id,
            message.length,
            message.delivery_count,
            message.timestamp,
        )
        return page
