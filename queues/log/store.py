"""The durable store as the reactor thread sees it: one log directory, recovered and appended to.

Opening the store replays the log (:mod:`queues.log.recovery`): a torn tail is cut (and reported
in :attr:`MessageStore.recovered`), anything else unreadable refuses with
:class:`~queues.log.damage.LogDamaged` unless the store is opened to repair it. Then the store
places records (:mod:`queues.log.placement`): declarations, persistent messages (a body
written once however many queues share it, :mod:`queues.log.enqueuing`), and their state
changes, buffered in order and placed when the batch is taken. Bodies are read back through
:mod:`queues.log.bodies`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sluicegate.queues.log.bodies import DEFAULT_CACHE_BYTES, Bodies
from sluicegate.queues.log.changes import StateChanges
from sluicegate.queues.log.damage import LogDamaged
from sluicegate.queues.log.enqueuing import Enqueuing
from sluicegate.queues.log.ledger import SegmentLedger
from sluicegate.queues.log.paged import DiskPage, LogPager
from sluicegate.queues.log.placement import (
    DEFAULT_SEGMENT_SIZE,
    MAX_SEGMENT_SIZE,
    Placement,
    WriteBatch,
    write_batches,
)
from sluicegate.queues.log.reading import PageReader
from sluicegate.queues.log.records import (
    Arguments,
    encode_segments_deleted,
)
from sluicegate.queues.log.recovery import (
    BindingKey,
    CleanShutdown,
    ExchangeState,
    RecoveredState,
    binding_key,
)
from sluicegate.queues.log.segments import (
    SegmentReader,
    SegmentWriter,
    list_segments,
    recover,
    remove_clean_shutdown,
    segment_path,
    truncate_segment,
    write_clean_shutdown,
)
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.log.stream_entries import BodyReader, LoggedEntries
from sluicegate.queues.log.topology import LoggedTopology
from sluicegate.queues.message import Message
from sluicegate.queues.paging import Pager

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_SEGMENT_SIZE",
    "MAX_SEGMENT_SIZE",
    "MessageStore",
    "StoredMessage",
    "WriteBatch",
    "write_batches",
    "write_now",
]


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
    """One log directory: recovery, placement, topology snapshots, compaction and bodies.

    ``repair``: open a damaged log anyway, replaying each segment up to its damage (the
    caller, ``sluicegate log repair``, has cut the segments there).
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        repair: bool = False,
    ) -> None:
        self.directory = directory
        recovery = recover(directory, segment_size)
        self.recovered: RecoveredState = recovery.state
        if self.recovered.refused and not repair:
            raise LogDamaged(self.recovered.refused, self.recovered.later_segments())
        torn = self.recovered.torn_tail
        if torn is not None and torn.offset is not None:
            truncate_segment(directory, torn.segment, torn.offset)
        remove_clean_shutdown(directory)
        self.ledger: SegmentLedger = recovery.ledger
        self.topology = LoggedTopology(self.recovered)
        self._changes = StateChanges()
        self.bodies = Bodies(SegmentReader(directory), cache_bytes)
        self.reader = PageReader(self, self.bodies, self.recovered)
        existing = list_segments(directory)
        self.placement = Placement(
            (existing[-1] + 1) if existing else 1,
            segment_size,
            self.ledger,
            self.recovered.next_id,
            self._snapshot,
            _unclosed(self.recovered, existing),
        )
        self.enqueuing = Enqueuing(self, self.placement, self.ledger, self.bodies, self._changes)
        # Log a persistent message (queues/log/enqueuing.py), bound once: it runs per message.
        self.enqueue = self.enqueuing.enqueue

    @property
    def queues(self) -> dict[str, Arguments]:
        """The durable queues and their arguments."""
        return self.topology.queues

    @property
    def exchanges(self) -> dict[str, ExchangeState]:
        """The durable exchanges."""
        return self.topology.exchanges

    @property
    def next_id(self) -> int:
        """The id the next message logged gets."""
        return self.placement.next_id

    @property
    def segment(self) -> int:
        """The segment records are placed in now."""
        return self.placement.segment

    # -- topology -------------------------------------------------------------------------

    def declare_queue(self, name: str, arguments: Arguments) -> None:
        """Log a durable queue (again, if its arguments changed)."""
        record = self.topology.declare_queue(name, arguments)
        if record is not None:
            self.placement.append([record])

    def delete_queue(self, name: str, messages: Iterable[Message]) -> None:
        """Log a queue's deletion; its persistent ``messages`` are settled first."""
        for message in messages:
            self.settled(message)
        self._remove_topology(self.topology.delete_queue(name))

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
        record = self.topology.declare_exchange(name, exchange)
        if record is not None:
            self.placement.append([record])

    def delete_exchange(self, name: str) -> None:
        """Log an exchange's deletion, and so its bindings'."""
        self._remove_topology(self.topology.delete_exchange(name))

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
        record = self.topology.bind(identity, arguments)
        if record is not None:
            self.placement.append([record])

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
        record = self.topology.unbind(identity)
        if record is not None:
            self._remove_topology(record)

    @property
    def bindings(self) -> dict[BindingKey, Arguments]:
        """The durable bindings, by identity."""
        return self.topology.bindings

    def _remove_topology(self, record: bytes) -> None:
        # Buffered settlements stay buffered: a dead letter routed later in this pass must
        # have its copy's enqueue placed before its original's settlement. Their order
        # against the removal does not matter: recovery ignores a settlement of a message
        # it no longer has, and a deleted queue's messages go with it.
        segment, _ = self.placement.append([record])
        self.ledger.topology_removed(segment)

    def _snapshot(self) -> list[bytes]:
        return self.topology.snapshot() + self._changes.snapshot()

    # -- messages -------------------------------------------------------------------------

    def pager(self, queue: str) -> Pager:
        """Pages for the durable queue ``queue``: its backlog beyond the resident messages."""
        return LogPager(self, queue)

    def take_recovered(self, queue: str) -> list[DiskPage]:
        """Pages of the messages recovery found in ``queue``, in log order, once.

        Nothing is read: the pages point at the records. A message a consumer held at the
        crash comes back with one more failed delivery, logged now.
        """
        pages, counted = self.reader.recovered_pages(queue)
        for message_id, segment, count in counted:
            self._changes.count(message_id, segment, count)
        return pages

    def iter_recovered_messages(self, queue: str) -> Iterator[StoredMessage]:
        """The messages recovered in ``queue``, read a page at a time (a stream's restore)."""
        for page in self.take_recovered(queue):
            yield from self.page_in(page, None)

    def stream_entries(self, queue: str) -> LoggedEntries:
        """Where the durable stream ``queue`` keeps its messages: their log positions."""
        return LoggedEntries(self, queue)

    def stream_emptied(self, queue: str, offset: int) -> None:
        """Log that the durable stream ``queue`` holds no message and goes on at ``offset``."""
        record = self.topology.stream_emptied(queue, offset)
        if record is not None:
            self.placement.append([record])

    def stream_offset(self, queue: str) -> int:
        """Where the durable stream ``queue`` goes on when it holds no message (0 unless
        retention or a purge emptied it)."""
        return self.topology.stream_offsets.get(queue, 0)

    def stored_message(
        self, queue: str, message_id: int, segment: int, offset: int, length: int
    ) -> StoredMessage:
        """A stream's logged message as an object again, its body read when delivered."""
        return StoredMessage(
            self, queue, message_id, segment, (offset, offset + length), (offset, length), 0
        )

    def body_reader(self) -> BodyReader:
        """What reads stream entries' bodies without making their messages (Bodies.read_at)."""
        return self.bodies.read_at

    def settle_entry(self, message_id: int, segment: int) -> None:
        """Settle a logged message that has no object (a stream entry retention drops)."""
        self._changes.settle(message_id, segment)

    def paged_entry(self, message: Message) -> StoredMessage | None:
        """``message`` if a page can hold it as a record's position: logged, ready, unpinned."""
        if type(message) is StoredMessage and message.journal is self and message.pinned is None:
            self.bodies.unload(message)
            return message
        return None

    def page_in(self, page: DiskPage, ttl: int | None) -> list[StoredMessage]:
        """Read a page's messages back: one read of its span, every record validated."""
        return self.reader.page_in(page, ttl)

    def drop_page(self, page: DiskPage) -> None:
        """Settle a page's messages in the log without reading them."""
        first, segment = page.first_id, page.segment
        pending = self.bodies.unwritten
        changes = self._changes
        for delta in page.ids:
            message_id = first + delta
            unwritten = pending.get(message_id)
            if unwritten is not None:
                unwritten[0].discard()
            else:
                changes.settle(message_id, segment)

    def settled(self, message: Message, sending: bool = False) -> None:
        """A persistent message is archived: accepted, rejected, purged or dropped.

        ``sending``: it is archived as it is handed to a consumer that settles nothing, so
        its body is kept with it until it is sent, whatever compaction does meanwhile.
        """
        if type(message) is StoredMessage:
            if sending:
                message.pinned = self.body(message)
            message.archived = True
            self._changes.settle(message.message_id, message.segment)
            self.bodies.forget(message)

    def settled_all(self, messages: list[StoredMessage]) -> None:
        """:meth:`settled` for each of ``messages`` (none sending), in one run of changes."""
        for message in messages:
            message.archived = True
        self._changes.settle_all(
            [message.message_id for message in messages], [message.segment for message in messages]
        )
        self.bodies.forget_all(messages)

    def acquired(self, message: Message) -> None:
        """A persistent message went to a consumer."""
        if type(message) is StoredMessage:
            self._changes.acquire(message.message_id, message.segment)

    def acquired_all(self, messages: list[StoredMessage]) -> None:
        """:meth:`acquired` for each of ``messages``, in one run of changes."""
        self._changes.acquire_all(
            [message.message_id for message in messages], [message.segment for message in messages]
        )

    def returned(self, message: Message, failed: bool) -> None:
        """A persistent message came back to its queue, after a failed attempt or not.

        One that was archived (handed to a pre-settled consumer, then never sent) is logged
        again as a new enqueue: its settlement may already be durable.
        """
        if type(message) is StoredMessage:
            if message.archived:
                self._relog(message)
            elif failed:
                self._count_failure(message)
            else:
                self._changes.give_back(message.message_id, message.segment)

    def _count_failure(self, message: StoredMessage) -> None:
        self._changes.count(message.message_id, message.segment, message.delivery_count)

    def _relog(self, message: StoredMessage) -> None:
        self.enqueuing.relog(
            message, message.pinned if message.pinned is not None else self.body(message)
        )

    def body(self, message: StoredMessage) -> bytes:
        """A message's stored bytes: from memory if not yet written or cached, else the disk."""
        return self.bodies.read(message)

    def sent_body(self, message: StoredMessage) -> bytes:
        """A message's stored bytes as it is sent to the consumer holding it: they leave the
        cache (Bodies.take)."""
        return self.bodies.take(message)

    # -- batches --------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """True if anything waits to be written."""
        return self.placement.pending or bool(self._changes.buffer)

    def take_batch(self) -> WriteBatch:
        """Everything appended since the last call, with the segments compaction freed.

        The segments freed are named in the batch (``SEGMENTS_DELETED``) before they go, so
        recovery tells a segment compaction deleted from one that went missing.
        """
        self._changes.place(self.placement, self.ledger)
        self.enqueuing.batch_taken()
        placement = self.placement
        deletions = self.ledger.collect(placement.segment)
        if deletions:
            placement.append([encode_segments_deleted(deletions)])
            for segment in deletions:
                self.bodies.reader.forget(segment)
        batch = placement.take()
        batch.deletions = deletions
        return batch

    def written(self, batch: WriteBatch) -> None:
        """A batch is durable: its bodies move from memory to the bounded cache."""
        self.bodies.written(batch.messages)

    def statistics(self) -> StoreStatistics:
        """Counts for metrics and tests."""
        torn = self.recovered.torn_tail
        return StoreStatistics(
            segments=len(self.ledger.segments),
            active_segment=self.segment,
            bytes_placed=self.placement.placed,
            unwritten_messages=len(self.bodies.unwritten),
            cached_bodies=self.bodies.cached,
            cached_bytes=self.bodies.cached_bytes,
            body_reads=self.bodies.reads,
            page_reads=self.reader.reads,
            recovered_messages=self.reader.count,
            truncated_bytes=0 if torn is None else torn.dropped_bytes,
        )

    def close(self, *, clean: bool = False) -> None:
        """Close the files; ``clean``: every batch taken is written and fsynced (the log
        writer stopped without giving up), so say where the log ends.

        The next start then refuses a log that is shorter than that (a last segment emptied or
        deleted), which a crash could not have made. Nothing is said if records are still
        placed but not taken, or the last segment is not as long as placed.
        """
        self.bodies.reader.close()
        placement = self.placement
        path = segment_path(self.directory, placement.segment)
        written = path.stat().st_size if path.exists() else -1
        if clean and not self.pending and written == placement.offset:
            write_clean_shutdown(self.directory, CleanShutdown(placement.segment, written))


def _unclosed(recovered: RecoveredState, existing: list[int]) -> list[tuple[int, int]]:
    """The segments to close before the next opens, with their lengths: the last one, and
    those a repair cut short (each ends where its valid records do, its tail cut off)."""
    closing = set(recovered.unended)
    if existing:
        closing.add(existing[-1])
    return [
        (number, recovered.valid_length[number])
        for number in sorted(closing & set(existing))
        if number not in recovered.ended
    ]


def write_now(store: MessageStore, writer: SegmentWriter) -> WriteBatch:
    """Write and fsync what ``store`` placed, on this thread, and tell the store it is durable.

    The synchronous group commit of tools (``bench/durable.py``) and tests; the server's log
    writer does the same on its own thread (gateway.log_writer).
    """
    batch = store.take_batch()
    write_batches(writer, [batch])
    store.written(batch)
    return batch
