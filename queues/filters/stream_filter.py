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
from collections.abc import Iterable
from typing import Final

from sluicegate.queues.filters.view import FILTER_VALUE_PART, ViewCache
from sluicegate.queues.message import Message

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

    A chunk's filter is an integer of ``8 * size`` bits, one more bit (``unfiltered``) set when
    the chunk holds a message without a value, and another (``unknown``) when it holds a
    message whose digest is not known.
    """

    __slots__ = ("_chunks", "_digests", "_first_chunk", "base", "unfiltered", "unknown", "width")

    def __init__(self, size: int = DEFAULT_FILTER_SIZE, base: int = 0) -> None:
        self.width = 8 * size
        self.unfiltered = 1 << self.width
        self.unknown = 1 << (self.width + 1)
        # Digests from offset ``base`` on; chunks from chunk number ``_first_chunk`` on.
        self.base = base
        self._digests = array("I")
        self._first_chunk = base // CHUNK_MESSAGES
        self._chunks: list[int] = []

    def append(self, message_digest: int) -> None:
        """Index the next offset's digest."""
        offset = self.base + len(self._digests)
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
        """Forget the offsets before ``base`` (retention dropped them)."""
        if base <= self.base:
            return
        del self._digests[: base - self.base]
        self.base = base
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
        return self._digests[offset - self.base]

    def next_candidate(
        self, offset: int, end: int, wanted: StreamFilter, masks: list[int], budget: int
    ) -> tuple[int, int]:
        """The first offset in ``[offset, end)`` that may be wanted, and the budget left.

        Each chunk skipped and each digest compared costs one unit of ``budget``; when it runs
        out, the offset reached is returned (``< end``, with budget 0) so the caller can pause.
        An UNKNOWN digest is a candidate: the caller reads the message.
        """
        digests = self._digests
        while offset < end and budget > 0:
            budget -= 1
            chunk = self._chunks[offset // CHUNK_MESSAGES - self._first_chunk]
            if not any(chunk & mask == mask for mask in masks):
                offset = min(end, (offset // CHUNK_MESSAGES + 1) * CHUNK_MESSAGES)
                continue
            message_digest = digests[offset - self.base]
            if message_digest == UNKNOWN or wanted.wants_digest(message_digest):
                return offset, budget
            offset += 1
        return offset, budget
