"""A persistent message as its queue holds it: where its record and body lie in the log.

The body is not kept: it is read back through the store (from memory while its batch is being
written, then from a bounded cache or the segment file). Several queues' messages may share one
body: a message routed to many durable queues is written once and referenced by the others'
records (:mod:`queues.log.records`, ``ENQUEUE_SHARED``).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import TYPE_CHECKING, Protocol

from sluicegate.queues.message import ACQUIRED, ARCHIVED, AVAILABLE, Message
from sluicegate.wire.annotations import merge_annotations, merged_map
from sluicegate.wire.sections import with_delivery_count

if TYPE_CHECKING:
    from sluicegate.queues.log.bodies import LoadedBodies


class MessageJournal(Protocol):
    """What a stored message asks of its store: its body, and logging its state changes."""

    def body(self, message: StoredMessage) -> bytes:
        """The stored bytes of ``message``."""

    def sent_body(self, message: StoredMessage) -> bytes:
        """The stored bytes of ``message``, about to be sent to the one consumer holding it:
        nothing else reads them before it comes back."""

    def acquired(self, message: Message) -> None:
        """``message`` went to a consumer."""

    def acquired_all(self, messages: list[StoredMessage]) -> None:
        """:meth:`acquired` for each of ``messages``, this journal's, in order."""

    def settled_all(self, messages: list[StoredMessage]) -> None:
        """:meth:`settled` (not sending) for each of ``messages``, this journal's, in order."""

    def settled(self, message: Message, sending: bool = False) -> None:
        """``message`` is archived; ``sending``: keep its body until it is sent."""

    def returned(self, message: Message, failed: bool) -> None:
        """``message`` came back to its queue, after a failed delivery or not."""


class StoredMessage(Message):
    """A persistent message: its record's place (segment and span) and its body's.

    Its queue changes its state by explicit calls (:meth:`acquire`, :meth:`archive`,
    :meth:`release`, :meth:`discard`, :meth:`count_failed_delivery`), each of which logs the
    change through the store; :meth:`read` reads its body. Nothing happens on attribute access.
    """

    __slots__ = (
        # A durable stream's entries remember the objects they handed out, weakly.
        "__weakref__",
        "_size",
        "annotations",
        "archived",
        "journal",
        "length",
        "loaded",
        "loaded_with",
        "message_id",
        "offset",
        "pinned",
        "queue",
        "record",
        "record_end",
        "segment",
        "shared",
        "timestamp",
    )

    def __init__(
        self,
        journal: MessageJournal,
        queue: str,
        message_id: int,
        segment: int,
        span: tuple[int, int],
        body: tuple[int, int],
        timestamp: int,
        delivery_count: int = 0,
        expires: int | None = None,
        exchange: str = "",
        routing_key: str = "",
        shared: bool = False,
    ) -> None:
        self.journal = journal
        self.queue = queue
        self.message_id = message_id
        self.segment = segment
        # Where its record starts and ends in the segment: what a page keeps and reads.
        self.record, self.record_end = span
        # Where its body lies in the same segment: in its own record, or in another's.
        self.offset, self.length = body
        # True when other messages' records refer to this body (or this one refers to another's).
        self.shared = shared
        self.timestamp = timestamp
        self.delivery_count = delivery_count
        self.seq = 0
        self.state = AVAILABLE
        self.expires = expires
        self.exchange = exchange
        self.routing_key = routing_key
        self.lock_deadline = 0
        self.priority = 0
        self.view = None
        self._header = None
        self.returned = 0
        # Never shared: its body is the store's, counted by the store's cache.
        self.share = None
        # Annotations consumers added with ``modified`` (an encoded map), merged into the body
        # each time it is read; kept in memory only.
        self.annotations: bytes | None = None
        # The wire size (:meth:`read_size`), None until known: a raised delivery-count rewrites
        # the header, which changes the size, and only a read of the body tells by how much.
        # Without one the wire bytes are the stored body's.
        self._size: int | None = None if delivery_count else self.length
        # Settled in the log: compaction may delete its segment at the next batch.
        self.archived = False
        # The body, read while its segment still exists, of a message settled before it is
        # sent (a pre-settled delivery waiting in its session).
        self.pinned: bytes | None = None
        # The body read with its page, counted in the store's body cache (queues.log.bodies)
        # until it is sent to the consumer holding it or the message is settled.
        self.loaded: bytes | None = None
        # What counts it (queues.log.bodies.LoadedBodies), with the other bodies of its page.
        self.loaded_with: LoadedBodies | None = None

    @property
    def body_key(self) -> int:
        """Identifies the body in the store's cache, shared by every message that shares it."""
        return (self.segment << 32) | self.offset

    def read(self) -> bytes:
        """The wire bytes, read through the store (memory, the cache, or the segment file),
        with the delivery-count raised after failures."""
        return self._wire(self.pinned if self.pinned is not None else self.journal.body(self))

    def send(self) -> bytes:
        """The wire bytes to send now. An acquired message is held by one consumer: once sent
        it is read again only if it comes back (released, modified, its consumer gone), so
        its body leaves the store's cache, which keeps room for the bodies not sent yet."""
        if self.pinned is not None:
            return self._wire(self.pinned)
        journal = self.journal
        return self._wire(journal.sent_body(self) if self.state == ACQUIRED else journal.body(self))

    def _wire(self, body: bytes) -> bytes:
        if self.delivery_count:
            body = with_delivery_count(body, self.delivery_count)
        return body if self.annotations is None else merge_annotations(body, self.annotations)

    def read_size(self) -> int:
        """Bytes on the wire, the header rewritten by a raised delivery-count included (a
        multi-frame delivery is sliced by it). Known without a read until the count changes,
        then read once per change: the common, never-failed message never reads its body."""
        size = self._size
        if size is None:
            size = self._size = len(self.read())
        return size

    @property
    def held(self) -> int:
        """The body kept with it until it is sent (:attr:`pinned`), and the annotations
        consumers added (kept in memory beside the body, perhaps shared by the messages of one
        ``modified`` range: each is charged them, an upper bound); the store bounds its own
        cache. A session charges what it holds waiting to its connection."""
        pinned = self.pinned
        annotations = self.annotations
        return (0 if pinned is None else len(pinned)) + (
            0 if annotations is None else len(annotations)
        )

    def acquire(self) -> None:
        """Handed to a consumer: logged."""
        self.state = ACQUIRED
        self.journal.acquired(self)

    def archive(self, *, sending: bool = False) -> None:
        """Settled: logged; ``sending``, its body is kept with it until it is sent, whatever
        compaction does meanwhile (a pre-settled delivery waiting in its session)."""
        if self.state != ARCHIVED:
            self.state = ARCHIVED
            self.journal.settled(self, sending)

    def release(self) -> None:
        """Back in its queue: logged (again as a new enqueue if its settlement was logged)."""
        if self.state != AVAILABLE:
            self.state = AVAILABLE
            self.journal.returned(self, False)

    def discard(self) -> None:
        """Archived unread (purged, expired, dropped): settled without keeping its body."""
        if self.state != ARCHIVED:
            self.state = ARCHIVED
            self.journal.settled(self)

    def annotate(self, additions: bytes) -> None:
        """Keep the annotations to merge into the body each time it is read."""
        current = self.annotations
        merged = additions if current is None else merged_map(current, additions)
        size = len(merge_annotations(self.read(), merged))
        self.annotations = merged
        self._size = size
        self.view = None

    def count_failed_delivery(self) -> None:
        """Count a failed attempt; the header is rewritten each time the body is read."""
        self.delivery_count += 1
        self._size = None
        self.journal.returned(self, True)


def acquire_all(messages: list[Message]) -> None:
    """:meth:`Message.acquire` for each of ``messages``, in order, with the changes of each
    run of one store's messages logged in one call: a consumer's credit takes thousands."""
    _change_all(messages, ACQUIRED, True, methodcaller("acquire"), _log_acquired)


def archive_all(messages: list[Message]) -> None:
    """:meth:`Message.archive` for each of ``messages``, in order, as :func:`acquire_all`
    does: a consumer accepts thousands of deliveries in one DISPOSITION."""
    _change_all(messages, ARCHIVED, False, methodcaller("archive"), _log_settled)


def _log_acquired(journal: MessageJournal, run: list[StoredMessage]) -> None:
    journal.acquired_all(run)


def _log_settled(journal: MessageJournal, run: list[StoredMessage]) -> None:
    journal.settled_all(run)


def _change_all(
    messages: list[Message],
    state: int,
    again: bool,
    each: Callable[[Message], None],
    log: Callable[[MessageJournal, list[StoredMessage]], None],
) -> None:
    """Put stored messages in ``state`` (``again``: also those in it already, as their own
    method does), logging each run of one journal's with ``log``; others change by ``each``."""
    run: list[StoredMessage] = []
    for message in messages:
        if type(message) is not StoredMessage:
            each(message)
        elif again or message.state != state:
            if run and message.journal is not run[0].journal:
                log(run[0].journal, run)
                run = []
            message.state = state
            run.append(message)
    if run:
        log(run[0].journal, run)
