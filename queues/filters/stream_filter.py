"""Stream filter values (RabbitMQ 4.1): ``x-stream-filter-value`` and ``rabbitmq:stream-filter``.

A publisher tags a message with a string in its ``x-stream-filter-value`` annotation; a
consumer asks for one or more values (``rabbitmq:stream-filter``), and with
``rabbitmq:stream-match-unfiltered`` also for messages without a value. RabbitMQ keeps a Bloom
filter of the values in each chunk of a stream so that a reader skips, unread, the chunks that
cannot hold a wanted value, then delivers every message of the chunks that may.

Here a stream keeps, per message, a 32-bit digest of its value (Python's string hash, keyed by
a random seed per process, so a client cannot aim for collisions) and, per chunk of
:data:`CHUNK_MESSAGES` consecutive offsets, a Bloom filter of those digests
(``x-stream-filter-size-bytes``, 16 to 255 bytes as in RabbitMQ, 16 by default) with one more
bit for "holds an unfiltered message". A filtered read tests a chunk's Bloom filter and skips the
chunk when it fails, without touching its messages; in a chunk that may match it compares
digests, so unlike RabbitMQ it delivers only the messages whose value is wanted (two values
whose digests collide, one chance in four billion, are told apart by nobody). Messages recovered
from the log have no digest until read: their chunks always may match, and their value is read
from the message itself.

On classic and quorum queues the same consumer filter reads the annotation from each message
(through its decoded view), so a stream filter means the same on every queue type.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import Final

from sluicegate.queues.filters.budget import ReadBudget
from sluicegate.queues.filters.view import FILTER_VALUE_PART, ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import MessageFilter

STREAM_FILTER: Final = "rabbitmq:stream-filter"
MATCH_UNFILTERED: Final = "rabbitmq:stream-match-unfiltered"
FILTER_SIZE_ARGUMENT: Final = "x-stream-filter-size-bytes"
# RabbitMQ's default size of a chunk's Bloom filter (queues.arguments checks 16 to 255).
DEFAULT_FILTER_SIZE: Final = 16
# Offsets per chunk: skipping a chunk skips this many messages for one test, and a chunk's
# filter costs well under a byte per message.
CHUNK_MESSAGES: Final = 64
# A message's digest when it has no filter value, and when it is not known (recovered).
NO_VALUE: Final = 0
UNKNOWN: Final = 0xFFFFFFFF
_DIGEST_MASK: Final = 0xFFFFFFFF
# How many values one consumer may ask for: each is tested against every chunk it reads.
MAX_FILTER_VALUES: Final = 64
# Offsets dropped from the front before the arrays are cut: cutting moves what is left.
_TRIM_AT: Final = 1024


def digest(value: str | None) -> int:
    """A filter value's 32-bit digest: never NO_VALUE or UNKNOWN for a value."""
    if value is None:
        return NO_VALUE
    hashed = hash(value) & _DIGEST_MASK
    return hashed if hashed not in (NO_VALUE, UNKNOWN) else 1


def filter_size(arguments: Iterable[tuple[str, object]]) -> int:
    """A stream's ``x-stream-filter-size-bytes`` (checked at declaration), or the default."""
    for name, value in arguments:
        if name == FILTER_SIZE_ARGUMENT and isinstance(value, int):
            return value
    return DEFAULT_FILTER_SIZE


class StreamFilter:
    """A consumer's wanted filter values; as a message filter, it reads the annotation."""

    __slots__ = ("_views", "digests", "match_unfiltered", "values")

    def __init__(self, values: list[str], match_unfiltered: bool, views: ViewCache) -> None:
        self.values = frozenset(values)
        self.digests = frozenset(digest(v) for v in values)
        self.match_unfiltered = match_unfiltered
        self._views = views

    def wants(self, value: str | None) -> bool:
        """True for a wanted value, or no value when unfiltered messages are wanted too."""
        return self.match_unfiltered if value is None else value in self.values

    def wants_digest(self, message_digest: int) -> bool:
        """True when a message of this digest is wanted (UNKNOWN: read the message)."""
        if message_digest == NO_VALUE:
            return self.match_unfiltered
        return message_digest in self.digests

    def __call__(self, message: Message) -> bool:
        """The message's own annotation decides (queues without a digest index)."""
        view = self._views.view(message, FILTER_VALUE_PART)
        return not view.malformed and self.wants(view.filter_value)


def _bits(message_digest: int, width: int) -> int:
    """The two bits a digest sets in a Bloom filter of ``width`` bits."""
    second = (message_digest * 0x9E3779B1 >> 16) & _DIGEST_MASK
    return 1 << (message_digest % width) | 1 << (second % width)


class ChunkFilters:
    """The digests of a stream's messages by offset, and a Bloom filter per chunk of them.

    Nothing is kept until the first message with a value (or of unknown value) arrives: a
    stream nobody tags costs nothing. A chunk's filter is an integer of ``8 * size`` bits, one
    more bit (``unfiltered``) set when the chunk holds a message without a value, and another
    (``unknown``) when it holds one whose digest is not known.
    """

    __slots__ = (
        "_chunks",
        "_digests",
        "_first_chunk",
        "_start",
        "base",
        "end",
        "unfiltered",
        "unknown",
        "width",
    )

    def __init__(self, size: int = DEFAULT_FILTER_SIZE) -> None:
        self.width = 8 * size
        self.unfiltered = 1 << self.width
        self.unknown = 1 << (self.width + 1)
        # The offsets indexed: from ``base`` (the stream's first) to ``end`` (its next).
        self.base = 0
        self.end = 0
        # Digests from offset ``_start`` on and chunks from number ``_first_chunk`` on: the
        # front is cut lazily, as the stream trims its own arrays.
        self._start = 0
        self._digests = array("I")
        self._first_chunk = 0
        self._chunks: list[int] = []

    @property
    def active(self) -> bool:
        """True once some message had a value (or an unknown one)."""
        return bool(self._chunks)

    def append(self, message_digest: int) -> None:
        """Index the next offset's digest."""
        if not self._chunks:
            if message_digest == NO_VALUE:
                self.end += 1
                return
            # The first tagged message: every message before it had no value.
            self._start = self.base
            self._first_chunk = self.base // CHUNK_MESSAGES
            self.end, pending = self.base, self.end - self.base
            for _ in range(pending):
                self._index(NO_VALUE)
        self._index(message_digest)

    def _index(self, message_digest: int) -> None:
        offset = self.end
        self.end = offset + 1
        self._digests.append(message_digest)
        index = offset // CHUNK_MESSAGES - self._first_chunk
        if index == len(self._chunks):
            self._chunks.append(0)
        if message_digest == NO_VALUE:
            self._chunks[index] |= self.unfiltered
        elif message_digest == UNKNOWN:
            self._chunks[index] |= self.unknown
        else:
            self._chunks[index] |= _bits(message_digest, self.width)

    def trim(self, base: int) -> None:
        """The stream dropped the offsets before ``base`` (retention or a purge)."""
        self.base = base
        dropped = base - self._start
        if dropped > _TRIM_AT and dropped * 2 > len(self._digests):
            del self._digests[:dropped]
            self._start = base
            first_chunk = base // CHUNK_MESSAGES
            del self._chunks[: first_chunk - self._first_chunk]
            self._first_chunk = first_chunk

    def masks(self, wanted: StreamFilter) -> list[int]:
        """The Bloom masks to test chunks with: one per wanted digest, plus the flags."""
        masks = [_bits(d, self.width) for d in wanted.digests]
        if wanted.match_unfiltered:
            masks.append(self.unfiltered)
        masks.append(self.unknown)
        return masks

    def digest_at(self, offset: int) -> int:
        """The digest of the message at ``offset``."""
        return self._digests[offset - self._start] if self._chunks else NO_VALUE

    def next_candidate(
        self, offset: int, end: int, wanted: StreamFilter, masks: list[int], budget: ReadBudget
    ) -> int:
        """The first offset in ``[offset, end)`` that may be wanted.

        Each chunk skipped and each digest compared costs a unit of ``budget``; when it is
        spent, the offset reached is returned (``< end``) so the caller can pause. An UNKNOWN
        digest is a candidate: the caller reads the message.
        """
        if not self._chunks:
            budget.units -= 1
            return offset if wanted.match_unfiltered else end
        digests = self._digests
        start = self._start
        chunks = self._chunks
        first_chunk = self._first_chunk
        while offset < end and not budget.spent:
            budget.units -= 1
            chunk = chunks[offset // CHUNK_MESSAGES - first_chunk]
            if not any(chunk & mask == mask for mask in masks):
                offset = min(end, (offset // CHUNK_MESSAGES + 1) * CHUNK_MESSAGES)
                continue
            message_digest = digests[offset - start]
            if message_digest == UNKNOWN or wanted.wants_digest(message_digest):
                return offset
            offset += 1
        return offset


class StreamReader:
    """A filtered stream reader: the values it wants and the filter its messages must pass.

    Its reads draw on a :class:`~queues.filters.budget.ReadBudget`, so a credit request does
    bounded work however much of the stream matches nothing.
    """

    __slots__ = ("accept", "masks", "views", "wanted")

    def __init__(
        self,
        accept: MessageFilter | None,
        wanted: StreamFilter | None,
        chunks: ChunkFilters,
        views: ViewCache | None,
    ) -> None:
        self.accept = accept
        self.wanted = wanted
        self.masks = chunks.masks(wanted) if wanted is not None else []
        self.views = views

    def wants(self, message: Message, message_digest: int, budget: ReadBudget) -> bool:
        """Whether a message just appended, of this digest, goes to this reader: a unit of
        ``budget`` for the digest, and what the filter's evaluation cost."""
        budget.units -= 1
        wanted = self.wanted
        if wanted is not None and not wanted.wants_digest(message_digest):
            return False
        return self.accept is None or budget.passes(self.accept, message, self.views)

    def _value_wanted(self, message: Message, message_digest: int, budget: ReadBudget) -> bool:
        """A candidate's value is wanted by its digest; a recovered one's is read from it."""
        wanted = self.wanted
        if wanted is None or message_digest != UNKNOWN:
            return True
        return budget.passes(wanted, message, self.views)

    def next_wanted(
        self,
        offset: int,
        end: int,
        chunks: ChunkFilters,
        message_at: Callable[[int], Message],
        budget: ReadBudget,
    ) -> tuple[int, Message | None]:
        """The next offset from ``offset`` on this reader wants, and its message.

        With the budget spent first the message is None and the offset is where to go on from.
        """
        wanted = self.wanted
        accept = self.accept
        views = self.views
        while offset < end and not budget.spent:
            if wanted is not None:
                offset = chunks.next_candidate(offset, end, wanted, self.masks, budget)
                if offset >= end or budget.spent:
                    break
            message = message_at(offset)
            if self._value_wanted(message, chunks.digest_at(offset), budget) and (
                accept is None or budget.passes(accept, message, views)
            ):
                return offset, message
            offset += 1
        return offset, None
