"""Reading pages of persistent messages back from the log, and the pages recovery found.

A page is read with one ``pread`` of its span; every record in it is checked (its CRC, its
type, its id and queue) before its message is made. Messages whose batch is not written yet
are the ones still in memory. The bodies stay on their messages, counted in the body cache,
so delivering them reads nothing more (:mod:`queues.log.bodies`).
"""

from __future__ import annotations

import zlib

from sluicegate.queues.log.bodies import Bodies
from sluicegate.queues.log.decoding import (
    ENQUEUE_RECORD_HEAD,
    ROUTED,
    RoutedRecords,
    decode_record,
)
from sluicegate.queues.log.paged import DiskPage, PageStore
from sluicegate.queues.log.records import Enqueued
from sluicegate.queues.log.recovery import (
    LogCorrupted,
    MessageStates,
    RecoveredPage,
    RecoveredState,
)
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.wire.errors import DecodeError


class PageReader:
    """Turns pages into messages, for one store."""

    def __init__(self, store: PageStore, bodies: Bodies, recovered: RecoveredState) -> None:
        self.journal = store
        self.bodies = bodies
        self.recovered = recovered
        self.reads = 0
        # Messages handed to their queues as recovered pages.
        self.count = 0

    def recovered_pages(self, queue: str) -> tuple[list[DiskPage], list[tuple[int, int, int]]]:
        """The live messages recovery found in ``queue`` as pages, once; nothing is read.

        Also returns ``(message id, segment, delivery count)`` of those that failed a delivery
        or were held by a consumer when the log ended (that delivery counts as failed now).
        """
        recovered = self.recovered
        raw_pages = recovered.backlogs.pop(queue, None)
        if raw_pages is None:
            return [], []
        messages = recovered.messages
        pages: list[DiskPage] = []
        for raw in raw_pages:
            settled = messages.settled_in(raw)
            page = self._live_page(queue, raw, set(settled)) if settled else self._page(queue, raw)
            if page is not None:
                pages.append(page)
                self.count += page.count
        counted: list[tuple[int, int, int]] = []
        if messages.acquired or messages.failures:
            for page in pages:
                for index, message_id in enumerate(page.message_ids()):
                    count = messages.delivery_count(message_id)
                    if count:
                        if page.failures is None:
                            page.failures = {}
                        page.failures[index] = count
                        counted.append((message_id, page.segment, count))
        if not recovered.backlogs:
            # Every queue has its pages: the states, one byte per id, can go.
            recovered.messages = MessageStates()
        return pages, counted

    def _page(self, queue: str, raw: RecoveredPage) -> DiskPage:
        return DiskPage.of(self.journal, queue, raw, raw.sizes)

    def _live_page(self, queue: str, raw: RecoveredPage, settled: set[int]) -> DiskPage | None:
        page: DiskPage | None = None
        for index, message_id in enumerate(raw.message_ids()):
            if index in settled:
                continue
            if page is None:
                page = DiskPage(
                    self.journal, queue, raw.segment, raw.start, raw.first_id, raw.first_timestamp
                )
            page.add(
                raw.offsets[index], raw.end, message_id, raw.sizes[index], 0, raw.first_timestamp
            )
        if page is not None:
            page.last_timestamp = raw.last_timestamp
        return page

    def page_in(self, page: DiskPage, ttl: int | None) -> list[StoredMessage]:
        """Read a page's messages back: one read of its span, every record validated.

        ``ttl`` (the queue's ``x-message-ttl``) counts from each message's arrival. A page's
        records mostly repeat one queue, exchange and routing key: once a record's names are
        decoded, the next records that start with the same bytes (:class:`RoutedRecords`) are
        checked without decoding them again (:func:`_routed_run`). The bodies stay on their
        messages as far as the body cache makes room for them, older cached bodies going first.
        """
        first, ids, offsets = page.first_id, page.ids, page.offsets
        count = len(offsets)
        bodies = self.bodies
        pending = bodies.unwritten
        written = count
        while written and first + ids[written - 1] in pending:
            written -= 1
        buffer = b""
        if written:
            stop = page.end if written == count else offsets[written]
            buffer = bodies.reader.read_upto(page.segment, page.start, stop - page.start)
            self.reads += 1
        failures = page.failures or {}
        routed = RoutedRecords(buffer, page.start)
        messages: list[StoredMessage] = []
        read: list[tuple[StoredMessage, memoryview | bytes]] = []
        index = 0
        while index < written:
            index = _routed_run(self.journal, page, routed, index, written, messages, read)
            if index < written:
                message, body = self._read(
                    page, routed, offsets[index], first + ids[index], failures.get(index, 0)
                )
                messages.append(message)
                if body is not None:
                    read.append((message, body))
                index += 1
        messages.extend(pending[first + ids[index]][0] for index in range(written, count))
        if ttl is not None:
            for message in messages:
                deadline = message.timestamp + ttl
                if message.expires is None or deadline < message.expires:
                    message.expires = deadline
        if read:
            bodies.load(read)
        return messages

    def _read(
        self, page: DiskPage, routed: RoutedRecords, offset: int, message_id: int, failures: int
    ) -> tuple[StoredMessage, memoryview | bytes | None]:
        """The message whose record is at ``offset``, decoded in full, and its body if the
        record holds it."""
        start = offset - page.start
        try:
            record, end = decode_record(routed.buffer, start)
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
        routed.learn(offset, record)
        shared = record.body_segment is not None
        body = (record.body_offset, record.body_length) if shared else None
        if body is None:
            body = (offset + record.payload_offset, len(record.payload))
        message = StoredMessage(
            self.journal,
            page.queue,
            message_id,
            page.segment,
            (offset, offset + end - start),
            body,
            record.timestamp,
            delivery_count=failures,
            expires=record.expires,
            exchange=record.exchange,
            routing_key=record.routing_key,
            shared=shared,
        )
        return message, None if shared else record.payload


def _routed_run(
    journal: PageStore,
    page: DiskPage,
    routed: RoutedRecords,
    index: int,
    stop: int,
    messages: list[StoredMessage],
    read: list[tuple[StoredMessage, memoryview | bytes]],
) -> int:
    """Make the messages of the page's records from ``index`` on, up to ``stop``, that have
    the names ``routed`` knows, each whole, right (its CRC, type and id) and holding its body;
    append them to ``messages`` and with their bodies to ``read``. Return the index of the
    first record that is not such, to decode in full.

    The loop of a page-in, kept in one frame: a page holds up to thousands of records.
    """
    names = routed.names
    if not names:
        return index
    buffer, view, base = routed.buffer, routed.view, routed.base
    size = len(buffer)
    head_size, names_size = ENQUEUE_RECORD_HEAD.size, len(names)
    unpack, startswith, crc32 = ENQUEUE_RECORD_HEAD.unpack_from, buffer.startswith, zlib.crc32
    first, ids, offsets, failures = page.first_id, page.ids, page.offsets, page.failures
    queue, segment = page.queue, page.segment
    exchange, routing_key = routed.exchange, routed.routing_key
    add, keep = messages.append, read.append
    while index < stop:
        offset = offsets[index]
        message_id = first + ids[index]
        pos = offset - base
        names_at = pos + head_size
        if names_at > size:
            return index
        length, crc, kind, record_id, timestamp, stored_expiry = unpack(buffer, pos)
        body_at = names_at + names_size
        end = pos + 8 + length
        if (
            kind != ROUTED
            or record_id != message_id
            or not body_at <= end <= size
            or not startswith(names, names_at)
            or crc32(view[pos + 8 : end]) != crc
        ):
            return index
        message = StoredMessage(
            journal,
            queue,
            message_id,
            segment,
            (offset, base + end),
            (base + body_at, end - body_at),
            timestamp,
            failures.get(index, 0) if failures else 0,
            stored_expiry - 1 if stored_expiry else None,
            exchange,
            routing_key,
        )
        add(message)
        # A slice of bytes is the copy the body cache keeps (Bodies.load copies other buffers).
        keep((message, buffer[body_at:end]))
        index += 1
    return index
