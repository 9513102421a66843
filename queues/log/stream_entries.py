"""A durable stream's messages as log positions: some thirty bytes a message, not an object.

Every message of a durable stream is logged, and a stream keeps everything until retention
drops it, so its backlog can be far larger than memory. An entry is the message's id and where
its body lies (segment, offset, length); a delivery gets a :class:`StoredMessage` made from
it, whose body is read from the cache or the log as for any stored message. The objects handed
out are remembered weakly by id: when retention drops a message still waiting in a session,
its body is kept with it (``pinned``) before compaction may delete its segment.
"""

from __future__ import annotations

from array import array
from typing import Final, Protocol
from weakref import WeakValueDictionary

from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.message import Message

# What an entry costs in memory, for the memory budget: its id (8 bytes), segment, offset and
# length (4 each) in arrays, and the stream's arrival timestamp (8).
ENTRY_BYTES: Final = 28


class EntryStore(Protocol):
    """What a stream's entries need of the store."""

    def stored_message(
        self, queue: str, message_id: int, segment: int, offset: int, length: int
    ) -> StoredMessage:
        """The message at a logged position, as an object."""

    def settle_entry(self, message_id: int, segment: int) -> None:
        """Settle a logged message that has no object."""

    def paged_entry(self, message: Message) -> StoredMessage | None:
        """``message`` if it is logged by this store."""


class LoggedEntries:
    """Implements :class:`queues.stream.StreamEntries` over the log."""

    __slots__ = ("_handed", "_ids", "_lengths", "_offsets", "_segments", "queue", "store")

    def __init__(self, store: EntryStore, queue: str) -> None:
        self.store = store
        self.queue = queue
        self._ids = array("Q")
        self._segments = array("I")
        self._offsets = array("I")
        self._lengths = array("I")
        self._handed: WeakValueDictionary[int, StoredMessage] = WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index: int) -> Message:
        message_id = self._ids[index]
        message = self._handed.get(message_id)
        if message is None:
            message = self.store.stored_message(
                self.queue,
                message_id,
                self._segments[index],
                self._offsets[index],
                self._lengths[index],
            )
            self._handed[message_id] = message
        return message

    def append(self, message: Message) -> int:
        """Keep the logged message's position (every message of a durable stream is logged)."""
        stored = self.store.paged_entry(message)
        if stored is None:
            raise TypeError(f"stream '{self.queue}' is durable: its messages must be logged")
        self._ids.append(stored.message_id)
        self._segments.append(stored.segment)
        self._offsets.append(stored.offset)
        self._lengths.append(stored.length)
        self._handed[stored.message_id] = stored
        return ENTRY_BYTES

    def size(self, index: int) -> int:
        """The message's bytes on the wire."""
        return self._lengths[index]

    def sizes(self, start: int, stop: int) -> array[int]:
        """The bytes on the wire of the messages at ``[start, stop)``: a slice of the array."""
        return self._lengths[start:stop]

    def drop(self, index: int) -> int:
        """Settle the message in the log; an object still out for delivery keeps its body."""
        message_id = self._ids[index]
        message = self._handed.pop(message_id, None)
        if message is not None:
            message.archive(sending=True)
        else:
            self.store.settle_entry(message_id, self._segments[index])
        return ENTRY_BYTES

    def trim(self, count: int) -> None:
        """Forget the first ``count`` entries."""
        for column in (self._ids, self._segments, self._offsets, self._lengths):
            del column[:count]
