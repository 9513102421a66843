"""The durable store as the reactor thread sees it: records placed, batched, and read back.

The store decides where every record goes (segment and offset) the moment it is appended, so
the ledger knows each message's segment at once and a failed write can be repeated in place.
Appends collect into a :class:`WriteBatch`; the gateway's log writer writes a batch (or several)
and covers them with one fsync, then hands them back to :meth:`MessageStore.written`.
Message bodies stay in memory only until their batch is written, then in a bounded cache;
after that they are read back from their segment (:class:`StoredMessage`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sluicegate.queues.log.ledger import SegmentLedger
from sluicegate.queues.log.paged import DiskPage, LogPager
from sluicegate.queues.log.records import (
    Arguments,
    Enqueued,
    RecordType,
    decode_record,
    encode_binding,
    encode_exchange_declared,
    encode_exchange_deleted,
    encode_messages_changed,
    encode_queue_declared,
    encode_queue_deleted,
    encode_segment_start,
    enqueue_prefix,
)
from sluicegate.queues.log.recovery import (
    BindingKey,
    ExchangeState,
    LogCorrupted,
    MessageStates,
    RecoveredPage,
    RecoveredState,
    Recovery,
    binding_key,
    without_exchange,
    without_queue,
)
from sluicegate.queues.log.segments import (
    SegmentReader,
    SegmentWriter,
    list_segments,
    read_segments,
    segment_path,
    sync_directory,
    truncate_segment,
)
from sluicegate.queues.log.stream_entries import LoggedEntries
from sluicegate.queues.message import ACQUIRED, ARCHIVED, AVAILABLE, Message
from sluicegate.queues.paging import Pager
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import with_delivery_count

# Large enough that rolling (an fsync and a topology snapshot) is rare, small enough that
# compaction frees disk in useful steps and recovery reads one segment at a time in memory.
DEFAULT_SEGMENT_SIZE: Final = 16 * 1024 * 1024
# Offsets within a segment are u32s in pages and recovery: a segment ends within one record
# (at most MAX_RECORD_SIZE) past its size, so 2 GiB segments keep them under 4 GiB.
MAX_SEGMENT_SIZE: Final = 2 * 1024 * 1024 * 1024
# Bodies kept after their write, for consumers that read close behind publishers.
DEFAULT_CACHE_BYTES: Final = 16 * 1024 * 1024
# Message ids per settle/acquire/return record: bounds one record's size (8 bytes per id).
_IDS_PER_RECORD: Final = 65536


class StoredMessage(Message):
    """A persistent message: an index entry (segment, offset, size), its body read on demand.

    Its queue changes its state as for any message; each change is logged (acquired,
    returned, archived), so the queue itself needs no knowledge of the log.
    """

    __slots__ = (
        # A durable stream's entries remember the objects they handed out, weakly.
        "__weakref__",
        "_state",
        "archived",
        "head",
        "length",
        "message_id",
        "offset",
        "pinned",
        "queue",
        "segment",
        "store",
        "timestamp",
    )

    def __init__(
        self,
        store: MessageStore,
        queue: str,
        message_id: int,
        segment: int,
        offset: int,
        length: int,
        timestamp: int,
        delivery_count: int = 0,
        expires: int | None = None,
        exchange: str = "",
        routing_key: str = "",
        head: int = 0,
    ) -> None:
        self.store = store
        self.queue = queue
        self.message_id = message_id
        self.segment = segment
        self.offset = offset
        self.length = length
        # Bytes of its record before the body: the record starts at ``offset - head``.
        self.head = head
        self.timestamp = timestamp
        self.delivery_count = delivery_count
        self.seq = 0
        self._state = AVAILABLE
        self.expires = expires
        self.exchange = exchange
        self.routing_key = routing_key
        self.lock_deadline = 0
        self.priority = 0
        # Settled in the log: compaction may delete its segment at the next batch.
        self.archived = False
        # The body, read while its segment still exists, of a message settled before it is
        # sent (a pre-settled delivery waiting in its session).
        self.pinned: bytes | None = None

    @property
    def payload(self) -> bytes:  # type: ignore[override]
        """The wire bytes: the stored body, with the delivery-count raised after failures."""
        body = self.pinned if self.pinned is not None else self.store.body(self)
        return with_delivery_count(body, self.delivery_count) if self.delivery_count else body

    @property
    def size(self) -> int:
        """Bytes on the wire, known without reading the body."""
        return self.length

    @property
    def held(self) -> int:
        """Nothing counts against the memory budget: the store bounds its own cache."""
        return 0

    @property
    def state(self) -> int:
        """AVAILABLE, ACQUIRED or ARCHIVED (queues.message)."""
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        old = self._state
        if old == value:
            return
        self._state = value
        store = self.store
        if value == ACQUIRED:
            store.acquired(self)
        elif value == ARCHIVED:
            # Archived straight from the queue: a pre-settled delivery still to be sent (or an
            # expiry or purge); its body is kept with it while its segment surely exists.
            store.settled(self, sending=old == AVAILABLE)
        else:
            store.returned(self, False)

    def discard(self) -> None:
        """Archived unread (purged, expired, dropped): settled without keeping its body."""
        if self._state != ARCHIVED:
            self._state = ARCHIVED
            self.store.settled(self)

    def count_failed_delivery(self) -> None:
        """Count a failed attempt; the header is rewritten each time the body is read."""
        self.delivery_count += 1
        self.store.returned(self, True)


@dataclass(slots=True)
class WriteBatch:
    """Records placed since the last batch, for the log writer to write and fsync."""

    # (segment, offset, buffers): the buffers are written contiguously at the offset.
    writes: list[tuple[int, int, list[bytes]]] = field(default_factory=list)
    # Segments compaction freed: deleted after this batch is durable.
    deletions: list[int] = field(default_factory=list)
    # Messages whose bodies this batch writes: they leave memory once it is written.
    messages: list[StoredMessage] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes the batch writes."""
        return sum(len(b) for _, _, buffers in self.writes for b in buffers)


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """The store's counts for metrics, tests and the benchmark."""

    segments: int
    active_segment: int
    bytes_placed: int
    unwritten_messages: int
    cached_bodies: int
    cached_bytes: int
    body_reads: int
    page_reads: int
    recovered_messages: int
    truncated_bytes: int


class MessageStore:
    """One log directory: placement, topology snapshots, compaction and the body cache."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        if not 0 < segment_size <= MAX_SEGMENT_SIZE:
            raise ValueError(f"segment size must be 1 to {MAX_SEGMENT_SIZE} bytes")
        self.directory = directory
        self.segment_size = segment_size
        self.cache_bytes = cache_bytes
        recovery = Recovery()
        for number, data, last in read_segments(directory):
            recovery.segment(number, data, last)
        self.recovered: RecoveredState = recovery.state
        self.ledger: SegmentLedger = recovery.ledger
        for number, length in self.recovered.valid_length.items():
            if length < segment_path(directory, number).stat().st_size:
                truncate_segment(directory, number, length)
        self.queues: dict[str, Arguments] = dict(self.recovered.queues)
        self.exchanges: dict[str, ExchangeState] = dict(self.recovered.exchanges)
        self.bindings: dict[BindingKey, Arguments] = dict(self.recovered.bindings)
        self.next_id = self.recovered.next_id
        self.reader = SegmentReader(directory)
        self._batch = WriteBatch()
        # State changes to log: (record type, message id, the message's segment).
        self._changes: list[tuple[RecordType, int, int]] = []
        # The messages whose batch is not written yet, with their bodies: a page-in cannot
        # read their records, a delivery cannot read their bodies.
        self._unwritten: dict[int, tuple[StoredMessage, bytes]] = {}
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cached_bytes = 0
        self._body_reads = 0
        self._page_reads = 0
        self._placed = 0
        self._recovered_count = 0
        existing = list_segments(directory)
        self.segment = (existing[-1] + 1) if existing else 1
        self._offset = 0
        self._start_segment()

    # -- topology -------------------------------------------------------------------------

    def declare_queue(self, name: str, arguments: Arguments) -> None:
        """Log a durable queue (again, if its arguments changed)."""
        if self.queues.get(name) == arguments and name in self.queues:
            return
        self.queues[name] = arguments
        self._append([encode_queue_declared(name, arguments)])

    def delete_queue(self, name: str, messages: Iterable[Message]) -> None:
        """Log a queue's deletion; its persistent ``messages`` are settled first."""
        for message in messages:
            self.settled(message)
        self.queues.pop(name, None)
        without_queue(self.bindings, name)
        self._remove_topology(encode_queue_deleted(name))

    def declare_exchange(
        self,
        name: str,
        kind: str,
        arguments: Arguments,
        *,
        auto_delete: bool = False,
        internal: bool = False,
    ) -> None:
        """Log a durable exchange with everything its declaration fixes."""
        exchange = ExchangeState(kind, arguments, auto_delete, internal)
        if self.exchanges.get(name) == exchange:
            return
        self.exchanges[name] = exchange
        self._append([_exchange_record(name, exchange)])

    def delete_exchange(self, name: str) -> None:
        """Log an exchange's deletion, and so its bindings'."""
        self.exchanges.pop(name, None)
        without_exchange(self.bindings, name)
        self._remove_topology(encode_exchange_deleted(name))

    def bind(
        self,
        exchange: str,
        destination: str,
        key: str,
        arguments: Arguments,
        *,
        to_exchange: bool = False,
    ) -> None:
        """Log a binding to a queue (or ``to_exchange``, to an exchange)."""
        identity = binding_key(exchange, destination, key, arguments, to_exchange=to_exchange)
        if identity in self.bindings:
            return
        self.bindings[identity] = arguments
        record = encode_binding(
            exchange, destination, key, arguments, True, to_exchange=to_exchange
        )
        self._append([record])

    def unbind(
        self,
        exchange: str,
        destination: str,
        key: str,
        arguments: Arguments,
        *,
        to_exchange: bool = False,
    ) -> None:
        """Log a binding's removal."""
        identity = binding_key(exchange, destination, key, arguments, to_exchange=to_exchange)
        if self.bindings.pop(identity, None) is not None:
            record = encode_binding(
                exchange, destination, key, arguments, False, to_exchange=to_exchange
            )
            self._remove_topology(record)

    # -- messages -------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: bytes,
        timestamp: int,
        expires: int | None = None,
        *,
        exchange: str = "",
        routing_key: str = "",
    ) -> StoredMessage:
        """Log a persistent message; it is durable once the batch holding it is written.

        ``exchange`` and ``routing_key`` say how it was published; recovery gives them back.
        """
        message_id = self.next_id
        self.next_id += 1
        prefix = enqueue_prefix(
            message_id,
            queue,
            timestamp,
            payload,
            expires,
            exchange=exchange,
            routing_key=routing_key,
        )
        segment, offset = self._append([prefix, payload])
        self.ledger.enqueued(segment)
        message = StoredMessage(
            self,
            queue,
            message_id,
            segment,
            offset + len(prefix),
            len(payload),
            timestamp,
            expires=expires,
            exchange=exchange,
            routing_key=routing_key,
            head=len(prefix),
        )
        self._unwritten[message_id] = (message, payload)
        self._batch.messages.append(message)
        return message

    def pager(self, queue: str) -> Pager:
        """Pages for the durable queue ``queue``: its backlog beyond the resident messages."""
        return LogPager(self, queue)

    def take_recovered(self, queue: str) -> list[DiskPage]:
        """Pages of the messages recovery found in ``queue``, in log order, once.

        Nothing is read: the pages point at the records. A message a consumer held at the
        crash comes back with one more failed delivery, logged now.
        """
        recovered = self.recovered
        raw_pages = recovered.backlogs.pop(queue, None)
        if raw_pages is None:
            return []
        messages = recovered.messages
        pages: list[DiskPage] = []
        for raw in raw_pages:
            settled = messages.settled_in(raw)
            if settled:
                page = self._live_page(queue, raw, set(settled))
                if page is None:
                    continue
            else:
                page = DiskPage.of(self, queue, raw, raw.sizes)
            pages.append(page)
            self._recovered_count += page.count
        if messages.acquired or messages.failures:
            acquired = messages.acquired
            failures = messages.failures
            for page in pages:
                for index, message_id in enumerate(page.message_ids()):
                    if message_id in acquired:
                        # The interrupted delivery counts as failed from now on, durably.
                        self._changes.append((RecordType.RETURN_FAILED, message_id, page.segment))
                    elif message_id not in failures:
                        continue
                    if page.failures is None:
                        page.failures = {}
                    page.failures[index] = messages.delivery_count(message_id)
        if not recovered.backlogs:
            # Every queue has its pages: the states, one byte per id, can go.
            recovered.messages = MessageStates()
        return pages

    def _live_page(self, queue: str, raw: RecoveredPage, settled: set[int]) -> DiskPage | None:
        page: DiskPage | None = None
        for index, message_id in enumerate(raw.message_ids()):
            if index in settled:
                continue
            if page is None:
                page = DiskPage(
                    self, queue, raw.segment, raw.start, raw.first_id, raw.first_timestamp
                )
            page.add(raw.offsets[index], raw.end, message_id, raw.sizes[index], 0)
        return page

    def iter_recovered_messages(self, queue: str) -> Iterator[StoredMessage]:
        """The messages recovered in ``queue``, read a page at a time (a stream's restore)."""
        for page in self.take_recovered(queue):
            yield from self.page_in(page, None)

    def stream_entries(self, queue: str) -> LoggedEntries:
        """Where the durable stream ``queue`` keeps its messages: their log positions."""
        return LoggedEntries(self, queue)

    def stored_message(
        self, queue: str, message_id: int, segment: int, offset: int, length: int
    ) -> StoredMessage:
        """A stream's logged message as an object again, its body read when delivered."""
        return StoredMessage(self, queue, message_id, segment, offset, length, 0)

    def settle_entry(self, message_id: int, segment: int) -> None:
        """Settle a logged message that has no object (a stream entry retention drops)."""
        self._changes.append((RecordType.SETTLE, message_id, segment))
        self._forget_body(message_id)

    def paged_entry(self, message: Message) -> StoredMessage | None:
        """``message`` if a page can hold it as a record's position: logged, ready, unpinned."""
        if type(message) is StoredMessage and message.store is self and message.pinned is None:
            return message
        return None

    def page_in(self, page: DiskPage, ttl: int | None) -> list[StoredMessage]:
        """Read a page's messages back: one read of its span, every record validated.

        Messages whose batch is not written yet are the ones enqueued (still in memory).
        Small bodies go to the cache while it has room, so delivering them reads nothing more;
        the cache is not churned for them, since a large credit may page in far ahead.
        ``ttl`` (the queue's ``x-message-ttl``) counts from each message's arrival.
        """
        first, ids, offsets = page.first_id, page.ids, page.offsets
        count = len(offsets)
        pending = self._unwritten
        written = count
        while written and first + ids[written - 1] in pending:
            written -= 1
        buffer = b""
        if written:
            stop = page.end if written == count else offsets[written]
            buffer = self.reader.read_upto(page.segment, page.start, stop - page.start)
            self._page_reads += 1
        failures = page.failures or {}
        room = self.cache_bytes - self._cached_bytes
        cache = self._cache
        messages: list[StoredMessage] = []
        for index in range(count):
            message_id = first + ids[index]
            if index >= written:
                message = pending[message_id][0]
            else:
                message, body = self._read_paged(
                    page, buffer, offsets[index], message_id, failures.get(index, 0)
                )
                if len(body) <= room:
                    cache[message_id] = bytes(body)
                    room -= len(body)
                    self._cached_bytes += len(body)
            if ttl is not None:
                deadline = message.timestamp + ttl
                if message.expires is None or deadline < message.expires:
                    message.expires = deadline
            messages.append(message)
        return messages

    def _read_paged(
        self, page: DiskPage, buffer: bytes, offset: int, message_id: int, failures: int
    ) -> tuple[StoredMessage, memoryview | bytes]:
        try:
            record, _ = decode_record(buffer, offset - page.start)
        except DecodeError as error:
            raise LogCorrupted(page.segment, offset, str(error)) from error
        if not (
            isinstance(record, Enqueued)
            and record.message_id == message_id
            and record.queue == page.queue
        ):
            raise LogCorrupted(
                page.segment, offset, f"message {message_id} of '{page.queue}' is not there"
            )
        message = StoredMessage(
            self,
            page.queue,
            message_id,
            page.segment,
            offset + record.payload_offset,
            len(record.payload),
            record.timestamp,
            failures,
            record.expires,
            record.exchange,
            record.routing_key,
            record.payload_offset,
        )
        return message, record.payload

    def drop_page(self, page: DiskPage) -> None:
        """Settle a page's messages in the log without reading them."""
        first, segment = page.first_id, page.segment
        pending = self._unwritten
        changes = self._changes
        for delta in page.ids:
            message_id = first + delta
            unwritten = pending.get(message_id)
            if unwritten is not None:
                unwritten[0].discard()
                continue
            changes.append((RecordType.SETTLE, message_id, segment))
            self._forget_body(message_id)

    def settled(self, message: Message, sending: bool = False) -> None:
        """A persistent message is archived: accepted, rejected, purged or dropped.

        ``sending``: it is archived as it is handed to a consumer that settles nothing, so
        its body is kept with it until it is sent, whatever compaction does meanwhile.
        """
        if type(message) is StoredMessage:
            if sending:
                message.pinned = self.body(message)
            message.archived = True
            self._changes.append((RecordType.SETTLE, message.message_id, message.segment))
            self._forget_body(message.message_id)

    def acquired(self, message: Message) -> None:
        """A persistent message went to a consumer."""
        if type(message) is StoredMessage:
            self._changes.append((RecordType.ACQUIRE, message.message_id, message.segment))

    def returned(self, message: Message, failed: bool) -> None:
        """A persistent message came back to its queue, after a failed attempt or not.

        One that was archived (handed to a pre-settled consumer, then never sent) is logged
        again as a new enqueue: its settlement may already be durable.
        """
        if type(message) is StoredMessage:
            if message.archived:
                self._relog(message)
                return
            kind = RecordType.RETURN_FAILED if failed else RecordType.RETURN
            self._changes.append((kind, message.message_id, message.segment))

    def _relog(self, message: StoredMessage) -> None:
        body = message.pinned if message.pinned is not None else self.body(message)
        fresh = self.enqueue(
            message.queue,
            body,
            message.timestamp,
            message.expires,
            exchange=message.exchange,
            routing_key=message.routing_key,
        )
        message.message_id = fresh.message_id
        message.segment = fresh.segment
        message.offset = fresh.offset
        message.head = fresh.head
        message.archived = False
        message.pinned = None
        self._batch.messages[-1] = message
        self._unwritten[fresh.message_id] = (message, self._unwritten[fresh.message_id][1])

    def body(self, message: StoredMessage) -> bytes:
        """A message's stored bytes: from memory if not yet written or cached, else the disk."""
        message_id = message.message_id
        unwritten = self._unwritten.get(message_id)
        if unwritten is not None:
            return unwritten[1]
        body = self._cache.get(message_id)
        if body is not None:
            return body
        self._body_reads += 1
        return self.reader.read(message.segment, message.offset, message.length)

    # -- batches --------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """True if anything waits to be written."""
        return bool(self._batch.writes or self._changes)

    def take_batch(self) -> WriteBatch:
        """Everything appended since the last call, with the segments compaction freed."""
        self._place_changes()
        batch = self._batch
        self._batch = WriteBatch()
        batch.deletions = self.ledger.collect(self.segment)
        for segment in batch.deletions:
            self.reader.forget(segment)
        return batch

    def written(self, batch: WriteBatch) -> None:
        """A batch is durable: its bodies move from memory to the bounded cache."""
        unwritten = self._unwritten
        cache = self._cache
        limit = self.cache_bytes
        for message in batch.messages:
            entry = unwritten.pop(message.message_id, None)
            if entry is None or message.archived:
                continue
            body = entry[1]
            cache[message.message_id] = body
            self._cached_bytes += len(body)
        while self._cached_bytes > limit and cache:
            _, body = cache.popitem(last=False)
            self._cached_bytes -= len(body)

    def statistics(self) -> StoreStatistics:
        """Counts for metrics and tests."""
        return StoreStatistics(
            segments=len(self.ledger.segments),
            active_segment=self.segment,
            bytes_placed=self._placed,
            unwritten_messages=len(self._unwritten),
            cached_bodies=len(self._cache),
            cached_bytes=self._cached_bytes,
            body_reads=self._body_reads,
            page_reads=self._page_reads,
            recovered_messages=self._recovered_count,
            truncated_bytes=self.recovered.truncated,
        )

    def close(self) -> None:
        """Close the files the reader holds."""
        self.reader.close()

    # -- internals ------------------------------------------------------------------------

    def _forget_body(self, message_id: int) -> None:
        body = self._cache.pop(message_id, None)
        if body is not None:
            self._cached_bytes -= len(body)

    def _append(self, buffers: list[bytes]) -> tuple[int, int]:
        size = sum(len(b) for b in buffers)
        if self._offset + size > self.segment_size and self._offset > self._snapshot_end:
            self.segment += 1
            self._start_segment()
        segment, offset = self.segment, self._offset
        self._place(buffers, size)
        return segment, offset

    def _place(self, buffers: list[bytes], size: int) -> None:
        writes = self._batch.writes
        # Placement within a segment is contiguous: a batch's last write in the current
        # segment ends where the next record goes, so it grows instead of adding a write.
        if writes and writes[-1][0] == self.segment:
            writes[-1][2].extend(buffers)
            self._offset += size
            self._placed += size
            return
        writes.append((self.segment, self._offset, list(buffers)))
        self._offset += size
        self._placed += size

    def _start_segment(self) -> None:
        """Open a segment with its header and a snapshot of the topology.

        The snapshot lets compaction delete older segments that hold declarations: replaying
        from any remaining segment declares everything that still exists.
        """
        self._offset = 0
        self.ledger.open_segment(self.segment)
        records = [encode_segment_start(self.segment, self.next_id)]
        records += [_exchange_record(name, e) for name, e in self.exchanges.items()]
        records += [encode_queue_declared(name, args) for name, args in self.queues.items()]
        records += [
            encode_binding(
                k.exchange, k.destination, k.key, arguments, True, to_exchange=k.to_exchange
            )
            for k, arguments in self.bindings.items()
        ]
        for record in records:
            self._place([record], len(record))
        self._snapshot_end = self._offset

    def _remove_topology(self, record: bytes) -> None:
        # Buffered settlements stay buffered: a dead letter routed later in this pass must
        # have its copy's enqueue placed before its original's settlement. Their order
        # against the removal does not matter: recovery ignores a settlement of a message
        # it no longer has, and a deleted queue's messages go with it.
        segment, _ = self._append([record])
        self.ledger.topology_removed(segment)

    def _place_changes(self) -> None:
        """Encode buffered state changes, consecutive ones of a kind in one record, in order."""
        changes = self._changes
        if not changes:
            return
        self._changes = []
        start = 0
        while start < len(changes):
            kind = changes[start][0]
            end = start + 1
            while end < len(changes) and changes[end][0] is kind and end - start < _IDS_PER_RECORD:
                end += 1
            run = changes[start:end]
            segment, _ = self._append([encode_messages_changed(kind, [c[1] for c in run])])
            if kind is RecordType.SETTLE:
                ledger = self.ledger
                for _, _, message_segment in run:
                    ledger.settled(message_segment, segment)
            start = end


def _exchange_record(name: str, exchange: ExchangeState) -> bytes:
    return encode_exchange_declared(
        name,
        exchange.kind,
        exchange.arguments,
        auto_delete=exchange.auto_delete,
        internal=exchange.internal,
    )


def write_now(store: MessageStore, writer: SegmentWriter) -> WriteBatch:
    """Write and fsync what ``store`` placed, on this thread, and tell the store it is durable.

    The synchronous group commit of tools (``bench/durable.py``) and tests; the server's log
    writer does the same on its own thread (gateway.log_writer).
    """
    batch = store.take_batch()
    write_batches(writer, [batch])
    store.written(batch)
    return batch


def write_batches(writer: SegmentWriter, batches: list[WriteBatch]) -> None:
    """Write ``batches`` and cover them with one fsync, then delete the segments they freed.

    Deletions wait for the fsync (the settlements that free a segment are in the batch) and are
    made durable before the next batch, so a crash never brings back an older segment after a
    newer one that settled its messages is gone.
    """
    for batch in batches:
        for segment, offset, buffers in batch.writes:
            writer.write(segment, offset, buffers)
    writer.sync()
    deleted = False
    for batch in batches:
        for segment in batch.deletions:
            writer.delete(segment)
            deleted = True
    if deleted:
        sync_directory(writer.directory)
