"""The stream queue type (``x-queue-type: stream``): an append-only log read by offset.

Messages are never removed by consumers: every consumer reads everything from where it
attached (``rabbitmq:stream-offset-spec``: ``first``, ``last``, ``next``, an offset or a
timestamp), settlement changes nothing, and only retention (``x-max-length-bytes``,
``x-max-age``) drops messages, oldest first. Each message is stamped once, as it is appended,
with its offset in the message annotations (``x-stream-offset``), spliced into the encoded bytes
so the body is never decoded and every delivery sends the stored bytes as they are.

Readers may filter (docs/filters.md): by the values publishers tag messages with
(``x-stream-filter-value``), which the stream indexes per chunk of offsets so that a reader
skips chunks holding none it wants without reading them, and by any message filter. A credit
request reads within a budget (queues.filters.budget); a reader that still has credit then
goes on at :meth:`StreamQueue.expire`, at the next tick, so a filter that matches nothing in a
long stream never holds the reactor.

Pure: time is the registry's clock; persistence is the message's business (a stored message
logs its own archival when retention drops it).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Final

from sluicegate.queues.arguments import QueueArguments
from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.filters.budget import ReadBudget
from sluicegate.queues.filters.stream_filter import (
    UNKNOWN,
    ChunkFilters,
    StreamReader,
    digest,
    filter_size,
)
from sluicegate.queues.held_bytes import HeldBytes, charge, refund
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    Clock,
    ConsumerKey,
    ConsumerOptions,
    CreditReply,
    Dispatch,
    OffsetSpec,
    Outcome,
    QueueStatistics,
)
from sluicegate.queues.storage import QueueStore, StreamEntries
from sluicegate.queues.timed_queues import TimedQueues
from sluicegate.wire.annotations import read_stream_offset, stamp_stream_offset
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd

_NO_DISPATCH: Final[list[Dispatch]] = []
# Paused readers read on per tick of the queues' clock: what one tick costs stays bounded
# however many readers a stream has.
_RESUMED_PER_TICK: Final = 4
# Sizes one byte-range request sums, on the reactor: about 0.2 ms,
# because a connection's frames are read READ_FRAMES (64) a pass
# (gateway/proton/io_layer.py) and the management node lets a link pair have 8 requests in
# flight, so a flood of requests costs a pass 64 of them: 30 ms. With 100,000 it cost over half
# a second and stalled other clients (tests/integration/test_stalls_and_lockouts.py). A longer
# range is asked for in parts.
MAX_SIZES_PER_RANGE: Final = 10_000
# Sizes summed at once while a byte range fits: large enough that the sums run in C, small
# enough that accumulating the one block where the range ends stays cheap.
SIZES_BLOCK: Final = 1_000
# RabbitMQ's x-max-age units: years, months, days, hours, minutes, seconds.
_AGE = re.compile(r"^(\d+)(Y|M|D|h|m|s)$")
_AGE_MS: Final = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1000,
}


def parse_max_age(value: object) -> int:
    """``x-max-age`` (``7D``, ``12h``, ``30s``...) in milliseconds."""
    match = _AGE.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) == 0:
        raise PreconditionFailed(
            f"invalid arg 'x-max-age': {value!r} is not a positive age such as 7D, 12h or 30s"
        )
    return int(match.group(1)) * _AGE_MS[match.group(2)]


class MessageEntries:
    """The messages themselves: a stream that is not logged.

    Their sizes are kept beside them in an array (4 bytes a message), so that a byte range
    sums them in C instead of asking 10,000 messages one call each (3 ms a request).
    """

    __slots__ = ("_messages", "_sizes")

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._sizes = array("I")

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, index: int) -> Message:
        return self._messages[index]

    def take(self, index: int, count: int, seq: int) -> list[Message]:
        """The messages, numbered by their offsets."""
        taken = self._messages[index : index + count]
        for message in taken:
            message.seq = seq
            seq += 1
        return taken

    def append(self, message: Message) -> int:
        """Keep the message, stamped with its offset already: its size is final."""
        self._messages.append(message)
        self._sizes.append(message.read_size())
        # A copy of a fan-out's payload counts it once (queues/held_bytes.py).
        return charge(message) + self._sizes.itemsize

    def size(self, index: int) -> int:
        """The message's bytes."""
        return self._sizes[index]

    def sizes(self, start: int, stop: int) -> array[int]:
        """The bytes of the messages at ``[start, stop)``: a slice of the array."""
        return self._sizes[start:stop]

    def drop(self, index: int) -> int:
        """Archive the message."""
        message = self._messages[index]
        message.archive()
        return refund(message) + self._sizes.itemsize

    def emptied(self, offset: int) -> None:
        """Nothing to keep: a stream that is not logged does not outlive the server."""

    def resumed_offset(self) -> int:
        """Nothing was kept: a stream that is not logged starts at 0."""
        return 0

    def trim(self, count: int) -> None:
        """Forget the first ``count`` messages."""
        del self._messages[:count]
        del self._sizes[:count]


@dataclass(slots=True, eq=False)
class StreamConsumer:
    """One reader: where it is in the stream, the credit it has, what it filters by."""

    key: ConsumerKey
    position: int
    delivery_count: int = 0
    credit: int = 0
    reader: StreamReader | None = None


class StreamQueue:
    """An append-only, non-destructive queue implementing :class:`queues.queue_type.QueueType`."""

    def __init__(
        self,
        name: str,
        arguments: QueueArguments,
        *,
        clock: Clock | None = None,
        held: HeldBytes | None = None,
        timed: TimedQueues | None = None,
    ) -> None:
        self.name = name
        self.arguments = arguments
        self.clock = clock if clock is not None else Clock()
        self.held = HeldBytes() if held is None else held
        # The registry's queues with deadlines: joined while x-max-age has messages to age.
        self._timed = TimedQueues() if timed is None else timed
        extra = dict(arguments.extra)
        self.max_age = parse_max_age(extra["x-max-age"]) if "x-max-age" in extra else None
        self.max_bytes = arguments.max_length_bytes
        # Messages from offset ``first`` on, trimmed from the front lazily; a durable stream
        # gets entries that keep log positions (queues.log.stream_entries).
        self.entries: StreamEntries = MessageEntries()
        self._timestamps = array("Q")
        self._head = 0
        self.first = 0
        self.next_offset = 0
        self._bytes = 0
        # The digest of the filter value of the message :meth:`as_stored` stamped, if it did.
        self._stamped: int | None = None
        # Filter values by offset and per chunk; nothing kept until a message has one.
        self._chunks = ChunkFilters(filter_size(arguments.extra))
        # Filtered readers whose last read ran out of budget with credit left, oldest first.
        self._paused: dict[StreamConsumer, None] = {}
        # Readers at the tail with credit: those a new message goes to. Walking every reader
        # per message made each publish cost O(readers), most of them behind or with no
        # credit (docs/bounds.md).
        self._tail: dict[StreamConsumer, None] = {}
        # What the filters of readers at the tail may cost the appends until the next tick:
        # evaluated per append uncharged, 500 filtered readers made each publish 500
        # evaluations; past it they wait in ``_paused`` and read on in their turn.
        self._tail_budget = ReadBudget()
        self._consumers: dict[ConsumerKey, StreamConsumer] = {}
        self._published = 0
        self._delivered = 0

    # -- storage --------------------------------------------------------------------------

    def attach_store(self, store: QueueStore) -> None:
        """A durable stream keeps its messages' log positions, not the messages."""
        self.entries = store.stream_entries(self.name)

    def persists(self, message: Message) -> bool:
        """Every message of a durable stream is logged, as in RabbitMQ."""
        return True

    def as_stored(self, message: Message) -> Message:
        """The message as it will be stored: stamped with the offset it is about to get.

        For a durable stream the stamped bytes are logged before :meth:`enqueue` appends them.
        """
        payload, value = stamp_stream_offset(message.payload, self.next_offset)
        self._stamped = digest(value)
        return Message(
            payload,
            expires=message.expires,
            exchange=message.exchange,
            routing_key=message.routing_key,
            header=message.read_header(),
        )

    # -- appending ------------------------------------------------------------------------

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Append a message (stamped unless :meth:`as_stored` did); readers at the tail get it."""
        message_digest = self._stamped
        if message_digest is None:
            message.payload, value = stamp_stream_offset(message.payload, self.next_offset)
            # Bytes of its own: out of a fan-out's share before it is counted.
            message.share = None
            message_digest = digest(value)
        self._stamped = None
        return self._append(message, self.clock.now, message_digest)

    def restore(self, store: QueueStore) -> None:
        """Put back the messages recovery found with their arrival times, stamped already.

        Offsets continue from them, or, when retention or a purge dropped them all, from where
        the log says the stream went on (its offsets only grow: a reader that stored offset N
        never sees another message at N). They are read a page at a time: only what the stream
        keeps of each message stays in memory. Their filter values are not read now (that would
        read every body): readers read them from the messages they reach.
        """
        resumed = self.entries.resumed_offset()
        self.first = self.next_offset = resumed
        self._chunks.base = self._chunks.end = resumed
        started = False
        for message in store.iter_recovered_messages(self.name):
            if not started:
                first = read_stream_offset(message.read())
                if first is None:
                    raise DecodeError(
                        f"stream '{self.name}': a recovered message has no x-stream-offset"
                    )
                self.first = self.next_offset = first
                self._chunks.base = self._chunks.end = first
                started = True
            self._append(message, message.timestamp, UNKNOWN)

    def _append(self, message: Message, timestamp: int, message_digest: int) -> list[Dispatch]:
        offset = self.next_offset
        self.next_offset = offset + 1
        message.seq = offset
        self.held.total += self.entries.append(message)
        self._timestamps.append(timestamp)
        self._bytes += message.read_size()
        self._published += 1
        self._chunks.append(message_digest)
        if self.max_age is not None:
            self._timed.add(self)
        dispatches = _NO_DISPATCH
        tail = self._tail
        if tail:
            spent: list[StreamConsumer] = []
            budget = self._tail_budget
            for state in tail:
                reader = state.reader
                if reader is not None:
                    if budget.spent:
                        # It reads this message on at the next tick, in its turn.
                        self._paused[state] = None
                        self._timed.add(self)
                        spent.append(state)
                        continue
                    if not reader.wants(message, message_digest, budget):
                        state.position = offset + 1
                        continue
                if dispatches is _NO_DISPATCH:
                    dispatches = []
                self._give(state, message)
                dispatches.append((state.key, message))
                if not state.credit:
                    spent.append(state)
            for state in spent:
                del tail[state]
        self._retain(self.clock.now)
        return dispatches

    # -- consumers ------------------------------------------------------------------------

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """Register a reader at the position its offset spec names (default: ``next``)."""
        state = StreamConsumer(consumer, self.position(options.offset))
        if options.filter is not None or options.stream_filter is not None:
            state.reader = StreamReader(
                options.filter, options.stream_filter, self._chunks, options.views
            )
        self._consumers[consumer] = state

    def position(self, spec: OffsetSpec | None) -> int:
        """The offset a reader attaching with ``spec`` starts at."""
        if spec is None or spec.kind == "next":
            return self.next_offset
        if spec.kind == "first":
            return self.first
        if spec.kind == "last":
            return max(self.first, self.next_offset - 1)
        if spec.kind == "offset":
            return min(max(spec.value, self.first), self.next_offset)
        index = bisect_left(self._timestamps, spec.value, lo=self._head)
        return self.first + index - self._head

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Forget a reader; nothing goes back, nothing was taken."""
        state = self._consumers.pop(consumer, None)
        if state is not None:
            self._paused.pop(state, None)
            self._tail.pop(state, None)
        return _NO_DISPATCH

    def give_back(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """The reader goes back to the first offset its session never sent: nothing was
        taken, and the session gives back all it holds, so it reads them again."""
        state = self._consumers.get(consumer)
        if state is not None and unsent:
            state.position = min(state.position, min(message.seq for message in unsent))
            self._delivered -= len(unsent)
            self._tail.pop(state, None)
        return _NO_DISPATCH

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        """Read on from the consumer's position while it has credit, then reply once."""
        state = self._consumers[consumer]
        state.credit = link_credit_snd(delivery_count, credit, state.delivery_count)
        taken = self._read(state)
        if drain and state.credit > 0:
            self._paused.pop(state, None)
            self._tail.pop(state, None)
            state.delivery_count = (state.delivery_count + state.credit) & SERIAL_MASK
            state.credit = 0
        available = self.next_offset - max(state.position, self.first)
        return taken, CreditReply(state.delivery_count, state.credit, available, drain)

    def _read(self, state: StreamConsumer) -> list[Message]:
        """Read on while the reader has credit: a filtered one within a budget, and paused (to
        go on at :meth:`expire`) if that is spent first."""
        reader = state.reader
        if reader is None:
            return self._read_all(state)
        taken: list[Message] = []
        entries = self.entries
        base = self.first - self._head
        budget = ReadBudget()
        while state.credit > 0 and state.position < self.next_offset:
            state.position = max(state.position, self.first)
            state.position, message = reader.next_wanted(
                state.position,
                self.next_offset,
                self._chunks,
                lambda offset: entries[offset - base],
                budget,
            )
            if message is None:
                break
            # A logged entry comes back as a fresh object: its offset is its sequence number.
            message.seq = state.position
            self._give(state, message)
            taken.append(message)
        if budget.spent and state.credit > 0 and state.position < self.next_offset:
            self._paused[state] = None
            self._timed.add(self)
        else:
            self._paused.pop(state, None)
        self._at_tail(state)
        return taken

    def _at_tail(self, state: StreamConsumer) -> None:
        """After a read: the reader waits at the tail for new messages if it has credit left."""
        if state.credit > 0 and state.position >= self.next_offset:
            self._tail[state] = None
        else:
            self._tail.pop(state, None)

    def _read_all(self, state: StreamConsumer) -> list[Message]:
        """An unfiltered reader takes every message on from its position, one batch of entries
        at once: what :meth:`_give` does per message, done once for them all."""
        if state.credit > 0 and state.position < self.next_offset:
            start = max(state.position, self.first)
            count = min(state.credit, self.next_offset - start)
            taken = self.entries.take(start - self.first + self._head, count, start)
            state.credit -= count
            state.delivery_count = (state.delivery_count + count) & SERIAL_MASK
            state.position = start + count
            self._delivered += count
        else:
            taken = []
        self._paused.pop(state, None)
        self._at_tail(state)
        return taken

    def _give(self, state: StreamConsumer, message: Message) -> None:
        state.credit -= 1
        state.delivery_count = (state.delivery_count + 1) & SERIAL_MASK
        state.position = message.seq + 1
        self._delivered += 1

    def settle(
        self,
        consumer: ConsumerKey,
        seqs: list[int],
        outcome: Outcome,
        delivery_failed: bool,
        *,
        undeliverable_here: bool = False,
        annotations: bytes | None = None,
    ) -> list[Dispatch]:
        """Nothing to do: a stream keeps its messages whatever readers say."""
        return _NO_DISPATCH

    def purge(self) -> int:
        """Drop every message (a deletion does this); offsets go on from where they were."""
        count = len(self.entries) - self._head
        while self._head < len(self.entries):
            self._drop_head()
        self.entries.trim(self._head)
        del self._timestamps[: self._head]
        self._head = 0
        return count

    # -- retention ------------------------------------------------------------------------

    def expire(self) -> list[Dispatch]:
        """Drop messages older than ``x-max-age`` at the clock's time, and read on for a few
        paused readers (the others, in turn, at the next ticks)."""
        self._retain(self.clock.now)
        self._tail_budget.refill()
        dispatches = _NO_DISPATCH
        for state in list(self._paused)[:_RESUMED_PER_TICK]:
            del self._paused[state]
            taken = self._read(state)
            if taken:
                if dispatches is _NO_DISPATCH:
                    dispatches = []
                dispatches.extend((state.key, message) for message in taken)
        return dispatches

    def next_deadline(self) -> int | None:
        """Now while readers are paused; else when the oldest message passes ``x-max-age``."""
        if self._paused:
            return self.clock.now
        if self.max_age is None or self._head == len(self.entries):
            return None
        return self._timestamps[self._head] + self.max_age

    def _retain(self, now: int) -> None:
        max_bytes = self.max_bytes
        max_age = self.max_age
        entries = self.entries
        timestamps = self._timestamps
        while self._head < len(entries) - 1 or (self._head < len(entries) and max_age is not None):
            too_big = max_bytes is not None and self._bytes > max_bytes
            too_old = max_age is not None and timestamps[self._head] + max_age <= now
            if not (too_big or too_old):
                break
            self._drop_head()
        if self._head > 1024 and self._head * 2 > len(entries):
            entries.trim(self._head)
            del timestamps[: self._head]
            self._head = 0

    def _drop_head(self) -> None:
        head = self._head
        self._bytes -= self.entries.size(head)
        self.held.total -= self.entries.drop(head)
        self._head = head + 1
        self.first += 1
        self._chunks.trim(self.first)
        if self._head == len(self.entries):
            self.entries.emptied(self.first)

    # -- sizes ----------------------------------------------------------------------------

    def byte_range(
        self, start: int, stop: int, max_bytes: int, *, at_least_one: bool
    ) -> tuple[int, int, bool]:
        """How far from ``start`` (towards ``stop``) the messages' sizes stay within ``max_bytes``.

        Returns ``(end, bytes, capped)``: the messages of ``[start, end)`` take ``bytes``, and
        ``end`` is ``stop`` or the first message that would go past ``max_bytes`` (or ``start
        + 1`` if that is the first and ``at_least_one``). A range begun before the stream's
        first offset begins at it. At most :data:`MAX_SIZES_PER_RANGE` sizes are looked at:
        ``capped`` says the range stopped there, to be asked again from ``end``. What the Spark
        connector plans ``maxBytesPerTrigger`` batches with (docs/spark.md), instead of reading
        every message to measure it.
        """
        start = max(start, self.first)
        stop = min(stop, self.next_offset)
        if start >= stop:
            return start, 0, False
        scanned = min(stop, start + MAX_SIZES_PER_RANGE)
        base = self.first - self._head
        sizes = self.entries.sizes(start - base, scanned - base)
        # Summed a block at a time in C; only the block where ``max_bytes`` is passed is
        # accumulated in Python: a request that fits whole costs a tenth of summing one by one.
        taken = 0
        for at in range(0, len(sizes), SIZES_BLOCK):
            block = sizes[at : at + SIZES_BLOCK]
            total = sum(block)
            if taken + total <= max_bytes:
                taken += total
                continue
            ends = list(accumulate(block, initial=taken))[1:]
            fitting = bisect_right(ends, max_bytes)
            if at + fitting == 0 and at_least_one:
                return start + 1, ends[0], False
            return start + at + fitting, ends[fitting - 1] if fitting else taken, False
        return scanned, taken, scanned < stop

    # -- statistics -----------------------------------------------------------------------

    def statistics(self) -> QueueStatistics:
        """Counts for metrics, tests and Spark's planning (first and last offsets)."""
        count = len(self.entries) - self._head
        return QueueStatistics(
            name=self.name,
            ready=count,
            unacked=0,
            consumers=len(self._consumers),
            ready_bytes=self._bytes,
            published=self._published,
            delivered=self._delivered,
            acknowledged=0,
            first_offset=self.first if count else None,
            last_offset=self.next_offset - 1 if count else None,
            next_offset=self.next_offset,
        )
