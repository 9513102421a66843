"""A durable stream's messages as log positions: some thirty bytes a message, not an object.

Every message of a durable stream is logged, and a stream keeps everything until retention
drops it, so its backlog can be far larger than memory. An entry is the message's id and where
its body lies (segment, offset, length).

A reader that takes every message (:meth:`LoggedEntries.take`) gets each one's body read at
once (from memory while unwritten, the cache, or the log, sliced from one read of many) in a
plain :class:`Message`: it owns its bytes, so retention and compaction may drop the entry and
its segment while it still waits in a session, and nothing needs to remember it. What one take
reads so is bounded (:data:`TAKE_BYTES`); a session holds at most one take per reader, charged
to its connection (session/waiting.py).

Bodies past that bound, and the messages filtered readers look at one by one
(:meth:`LoggedEntries.__getitem__`), are :class:`StoredMessage` objects whose body is read when
sent. Those handed out are remembered weakly by id: when retention drops a message still waiting
in a session, its body is kept with it (``pinned``) before compaction may delete its segment.
The weak references are plain ones in a plain dict, without callbacks: the references of
objects gone are swept out in one pass once they outnumber the live ones (:data:`SWEEP_AT`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Final, Protocol, TypeAlias
from weakref import ReferenceType, ref

from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.message import Message

# What an entry costs in memory, for the memory budget: its id (8 bytes), segment, offset and
# length (4 each) in arrays, and the stream's arrival timestamp (8).
ENTRY_BYTES: Final = 28
# Body bytes one take reads into the messages it hands out: a session's batch of 256 deliveries
# of up to 512 bytes. A session holds at most one batch per reader (session/outgoing_link.py),
# so this bounds what a reader's deliveries hold in memory beyond their objects, and a connection
# over max_outgoing_pending_size of them asks for no more (session/waiting.py); larger bodies
# are read when sent, as before.
TAKE_BYTES: Final = 128 * 1024
# The fewest references to objects handed out kept before a sweep: the live ones are a few
# sessions' batches (256 a reader), so sweeping is rare and each sweep short. Between sweeps the
# references of objects gone stay, at most this many or as many again as the live ones.
SWEEP_AT: Final = 1024


# Reads the bodies of logged messages from their ids, segments, offsets and lengths (columns
# of equal length), in that order.
BodyReader: TypeAlias = Callable[
    [Sequence[int], Sequence[int], Sequence[int], Sequence[int]], list[bytes]
]


class EntryStore(Protocol):
    """What a stream's entries need of the store."""

    def stored_message(
        self, queue: str, message_id: int, segment: int, offset: int, length: int
    ) -> StoredMessage:
        """The message at a logged position, as an object."""

    def body_reader(self) -> BodyReader:
        """What reads the bodies of logged messages from their ids, segments, offsets and
        lengths."""

    def settle_entry(self, message_id: int, segment: int) -> None:
        """Settle a logged message that has no object."""

    def paged_entry(self, message: Message) -> StoredMessage | None:
        """``message`` if it is logged by this store."""

    def stream_emptied(self, queue: str, offset: int) -> None:
        """Log that the stream holds no message and goes on at ``offset``."""

    def stream_offset(self, queue: str) -> int:
        """Where the stream goes on when it holds no message, as the log says."""


class LoggedEntries:
    """Implements :class:`queues.stream.StreamEntries` over the log."""

    __slots__ = (
        "_body",
        "_handed",
        "_ids",
        "_lengths",
        "_offsets",
        "_segments",
        "_sweep_at",
        "queue",
        "store",
    )

    def __init__(self, store: EntryStore, queue: str) -> None:
        self.store = store
        self.queue = queue
        self._ids = array("Q")
        self._segments = array("I")
        self._offsets = array("I")
        self._lengths = array("I")
        # The objects handed out (or appended), by id, while they live.
        self._handed: dict[int, ReferenceType[StoredMessage]] = {}
        self._sweep_at = SWEEP_AT
        self._body = store.body_reader()

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index: int) -> Message:
        message_id = self._ids[index]
        handed = self._handed.get(message_id)
        message = None if handed is None else handed()
        if message is None:
            message = self.store.stored_message(
                self.queue,
                message_id,
                self._segments[index],
                self._offsets[index],
                self._lengths[index],
            )
            self._hand(message_id, message)
        return message

    def take(self, index: int, count: int, seq: int) -> list[Message]:
        """The ``count`` messages from ``index`` on, numbered ``seq`` on, bodies read now up to
        :data:`TAKE_BYTES`, the rest as :meth:`__getitem__` gives them."""
        stop = index + count
        lengths = self._lengths[index:stop]
        if sum(lengths) <= TAKE_BYTES:
            # Every body fits (a batch of small messages): read them all in one call.
            bodies = self._body(
                self._ids[index:stop],
                self._segments[index:stop],
                self._offsets[index:stop],
                lengths,
            )
            return list(map(Message, bodies, repeat(0, count), range(seq, seq + count)))
        # The rest: bodies are read while they fit, in order, in one call; a body that does
        # not fit is left to its message object, and a smaller one after it may still fit.
        room = TAKE_BYTES
        fits: list[int] = []
        for at, length in enumerate(lengths, index):
            if length <= room:
                room -= length
                fits.append(at)
        ids, segments, offsets = self._ids, self._segments, self._offsets
        read = iter(
            self._body(
                [ids[at] for at in fits],
                [segments[at] for at in fits],
                [offsets[at] for at in fits],
                [lengths[at - index] for at in fits],
            )
        )
        picked = set(fits)
        taken: list[Message] = []
        for at in range(index, stop):
            if at in picked:
                message = Message(next(read), 0, seq)
            else:
                message = self[at]
                message.seq = seq
            seq += 1
            taken.append(message)
        return taken

    def _hand(self, message_id: int, message: StoredMessage) -> None:
        handed = self._handed
        handed[message_id] = ref(message)
        if len(handed) >= self._sweep_at:
            self._sweep()

    def _sweep(self) -> None:
        """Forget the references of objects gone."""
        live = {key: value for key, value in self._handed.items() if value() is not None}
        self._handed = live
        self._sweep_at = max(SWEEP_AT, 2 * len(live))

    def append(self, message: Message) -> int:
        """Keep the logged message's position (every message of a durable stream is logged)."""
        stored = self.store.paged_entry(message)
        if stored is None:
            raise TypeError(f"stream '{self.queue}' is durable: its messages must be logged")
        self._ids.append(stored.message_id)
        self._segments.append(stored.segment)
        self._offsets.append(stored.offset)
        self._lengths.append(stored.length)
        self._hand(stored.message_id, stored)
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
        handed = self._handed.pop(message_id, None)
        message = None if handed is None else handed()
        if message is not None:
            message.archive(sending=True)
        else:
            self.store.settle_entry(message_id, self._segments[index])
        return ENTRY_BYTES

    def emptied(self, offset: int) -> None:
        """Every message was dropped: the log keeps the offset the next one gets."""
        self.store.stream_emptied(self.queue, offset)

    def resumed_offset(self) -> int:
        """The offset the log says the stream went on at when it last held no message."""
        return self.store.stream_offset(self.queue)

    def trim(self, count: int) -> None:
        """Forget the first ``count`` entries."""
        for column in (self._ids, self._segments, self._offsets, self._lengths):
            del column[:count]
