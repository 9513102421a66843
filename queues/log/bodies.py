"""Message bodies on the reactor thread: in memory until written, then cached, then read back.

A body waits in memory (with its message, by id) until the batch holding it is durable; then it
moves to a bounded cache for consumers that read close behind publishers; after that it is read
back from its segment with ``pread``. A page read back leaves its bodies on its messages
(``StoredMessage.loaded``), counted in the cache's bytes, evicting cached bodies for them: those
are about to be sent, while a cached one may wait for a consumer far behind. A body sent to the
one consumer holding its message leaves the cache (:meth:`Bodies.take`): the cache holds the
bodies still to be sent, not those of the deliveries a consumer keeps unsettled (300,000 of
them, in the Spark connector's ``mode=queue``). Cached bodies are keyed by where the body lies,
so the queues sharing one body (a fan-out) share one cache entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final

from sluicegate.queues.log.segments import SegmentReader
from sluicegate.queues.log.stored import StoredMessage

# Bodies kept after their write, for consumers that read close behind publishers.
DEFAULT_CACHE_BYTES: Final = 16 * 1024 * 1024
# What a cached body costs beyond its bytes: its OrderedDict entry (105 bytes measured with
# 50,000 of them), its key (an int, 32) and the bytes object's header (33). Counted against the
# cache's size, so that 16 MiB of 100-byte bodies is 16 MiB of memory, not 45 (issue 31).
CACHE_ENTRY_COST: Final = 176


class LoadedBodies:
    """What is left of the bodies one page-in left on its messages (``StoredMessage.loaded``).

    Each message refers to it. A body sent or settled leaves its message and the cache's
    bytes at once; when the last message goes (its queue deleted while a session still held
    it unsent, say), what is left comes off the cache's bytes too, so no body is counted
    after nothing holds it.
    """

    __slots__ = ("bodies", "left")

    def __init__(self, bodies: Bodies) -> None:
        self.bodies = bodies
        self.left = 0

    def __del__(self) -> None:
        self.bodies.cached_bytes -= self.left


class Bodies:
    """The unwritten bodies, the cache of written ones, and reads from the segments."""

    def __init__(self, reader: SegmentReader, cache_bytes: int) -> None:
        self.reader = reader
        self.cache_bytes = cache_bytes
        # The messages whose batch is not written yet, with their bodies: a page-in cannot
        # read their records, a delivery cannot read their bodies.
        self.unwritten: dict[int, tuple[StoredMessage, bytes]] = {}
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self.cached_bytes = 0
        self.reads = 0
        # The reader's windows must not take in bytes of batches still being written.
        reader.durable_end = self.durable_end

    @property
    def cached(self) -> int:
        """Bodies in the cache."""
        return len(self._cache)

    def hold(self, message: StoredMessage, body: bytes) -> None:
        """Keep ``body`` in memory until the batch writing it is durable."""
        self.unwritten[message.message_id] = (message, body)

    def read(self, message: StoredMessage) -> bytes:
        """A message's stored bytes: from memory if not yet written or cached, else the disk."""
        loaded = message.loaded
        if loaded is not None:
            return loaded
        unwritten = self.unwritten.get(message.message_id)
        if unwritten is not None:
            return unwritten[1]
        body = self._cache.get(message.body_key)
        if body is not None:
            return body
        self.reads += 1
        body = self.reader.read(message.segment, message.offset, message.length)
        if message.shared and len(body) <= self.room():
            # Other queues' messages will want it too (a fan-out read back after a restart).
            self.put(message.body_key, body)
        return body

    def take(self, message: StoredMessage) -> bytes:
        """A message's stored bytes, as :meth:`read`, taken out of the cache unless other
        messages share them: its one consumer has them now."""
        loaded = message.loaded
        if loaded is not None:
            self.unload(message)
            return loaded
        if not message.shared:
            body = self._cache.pop(message.body_key, None)
            if body is not None:
                self.cached_bytes -= len(body)
                return body
        return self.read(message)

    def read_at(
        self,
        ids: Sequence[int],
        segments: Sequence[int],
        offsets: Sequence[int],
        lengths: Sequence[int],
    ) -> list[bytes]:
        """Bodies by their messages' ids and where they lie: from memory until written, then
        from the segments. A stream reads on in log order, so its reads come from the reader's
        windows; the cache is not looked in (its key alone cost as much as a window's slice).
        With nothing unwritten, as when a reader is behind its publishers, the segments are
        read without a look at each id."""
        read = self.reader.read
        if not self.unwritten:
            self.reads += len(lengths)
            return list(map(read, segments, offsets, lengths))
        unwritten = self.unwritten
        bodies: list[bytes] = []
        for message_id, segment, offset, length in zip(
            ids, segments, offsets, lengths, strict=True
        ):
            held = unwritten.get(message_id)
            if held is None:
                self.reads += 1
                bodies.append(read(segment, offset, length))
            else:
                bodies.append(held[1])
        return bodies

    def durable_end(self, segment: int) -> int | None:
        """Where the durable bytes of ``segment`` end, None for wherever its file ends.

        Records are placed in order and batches written in order, so the first message still
        unwritten (``unwritten`` keeps placement order) starts the bytes not yet durable: in its
        segment they end at its record; an earlier segment is durable whole, a later one not at
        all. Records that are not messages may lie unwritten before it; no body is there.
        """
        for message, _ in self.unwritten.values():
            if message.segment == segment:
                return message.record
            return 0 if message.segment < segment else None
        return None

    def room(self) -> int:
        """Bytes the cache may still take without evicting."""
        return self.cache_bytes - self.cached_bytes - len(self._cache) * CACHE_ENTRY_COST

    def load(self, pairs: list[tuple[StoredMessage, memoryview | bytes]]) -> None:
        """Leave each body read with its page on its message, as far as the cache makes room,
        evicting the newest cached bodies first (the oldest are the next to be paged in).

        A body the cache holds moves to its message; the others are copied out of the page.
        """
        cache = self._cache
        pop = cache.pop
        room = self.cache_bytes - self.cached_bytes
        holder = LoadedBodies(self)
        moved = copied = 0
        unplaced: list[tuple[StoredMessage, memoryview | bytes]] = []
        for message, body in pairs:
            cached = pop((message.segment << 32) | message.offset, None)
            if cached is not None:
                message.loaded = cached
                message.loaded_with = holder
                moved += len(cached)
            elif len(body) <= room - copied:
                message.loaded = bytes(body)
                message.loaded_with = holder
                copied += len(body)
            else:
                unplaced.append((message, body))
        self.cached_bytes += copied
        if unplaced:
            needed = sum(len(body) for _, body in unplaced)
            while self.cache_bytes - self.cached_bytes < needed and cache:
                _, evicted = cache.popitem()
                self.cached_bytes -= len(evicted)
            room = self.cache_bytes - self.cached_bytes
            for message, body in unplaced:
                if len(body) <= room:
                    message.loaded = bytes(body)
                    message.loaded_with = holder
                    room -= len(body)
                    copied += len(body)
            self.cached_bytes = self.cache_bytes - room
        holder.left = moved + copied

    def unload(self, message: StoredMessage) -> None:
        """Drop the body read with ``message``'s page (:attr:`StoredMessage.loaded`)."""
        loaded = message.loaded
        if loaded is not None:
            size = len(loaded)
            message.loaded = None
            holder = message.loaded_with
            if holder is not None:
                holder.left -= size
            self.cached_bytes -= size

    def put(self, key: int, body: bytes) -> None:
        """Cache a body read back with its page (the caller checked the room)."""
        if key not in self._cache:
            self._cache[key] = body
            self.cached_bytes += len(body)

    def forget(self, message: StoredMessage) -> None:
        """A settled message's body leaves the cache, unless other messages share it."""
        self.forget_all((message,))

    def forget_all(self, messages: Iterable[StoredMessage]) -> None:
        """:meth:`forget` for each of ``messages`` (a consumer accepts thousands at once)."""
        cache = self._cache
        for message in messages:
            if message.loaded is not None:
                self.unload(message)
            elif cache and not message.shared:
                body = cache.pop((message.segment << 32) | message.offset, None)
                if body is not None:
                    self.cached_bytes -= len(body)

    def written(self, messages: Iterable[StoredMessage]) -> None:
        """Their batch is durable: the bodies of the live ones move to the cache."""
        unwritten = self.unwritten
        for message in messages:
            entry = unwritten.pop(message.message_id, None)
            if entry is None or message.archived:
                continue
            self.put(message.body_key, entry[1])
        cache = self._cache
        while self.cached_bytes + len(cache) * CACHE_ENTRY_COST > self.cache_bytes and cache:
            _, body = cache.popitem(last=False)
            self.cached_bytes -= len(body)
