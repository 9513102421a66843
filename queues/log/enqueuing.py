"""Persistent messages placed in the log as enqueue records, each body written once.

The same payload object enqueued to several queues one after another (a fan-out, a dead
letter's copies) is written once while its records follow one another in one segment: the
later records refer to the first one's body. A message handed to a pre-settled consumer and
then never sent is logged again as a new enqueue, since its settlement may already be durable.
The store (:mod:`queues.log.store`) owns this and every other record of its log.
"""

from __future__ import annotations

from sluicegate.queues.log.bodies import Bodies
from sluicegate.queues.log.changes import StateChanges
from sluicegate.queues.log.ledger import SegmentLedger
from sluicegate.queues.log.placement import Placement
from sluicegate.queues.log.records import encode_enqueue_shared, enqueue_prefix
from sluicegate.queues.log.stored import MessageJournal, StoredMessage


class Enqueuing:
    """The enqueue records of one store, numbered by its placement's message ids."""

    __slots__ = (
        "_bodies",
        "_changes",
        "_journal",
        "_last",
        "_last_body",
        "_ledger",
        "_placement",
    )

    def __init__(
        self,
        journal: MessageJournal,
        placement: Placement,
        ledger: SegmentLedger,
        bodies: Bodies,
        changes: StateChanges,
    ) -> None:
        self._journal = journal
        self._placement = placement
        self._ledger = ledger
        self._bodies = bodies
        self._changes = changes
        # The last message enqueued: the next one with the same body object shares its body.
        self._last: StoredMessage | None = None
        self._last_body: bytes | None = None

    def enqueue(
        self,
        queue: str,
        payload: bytes,
        timestamp: int,
        expires: int | None = None,
        *,
        exchange: str = "",
        routing_key: str = "",
        delivery_count: int = 0,
    ) -> StoredMessage:
        """Log a persistent message; it is durable once the batch holding it is written.

        ``exchange`` and ``routing_key`` say how it was published; recovery gives them back,
        with ``delivery_count``.
        """
        placement = self._placement
        message_id = placement.next_id
        placement.next_id += 1
        holder = self._last
        if (
            holder is not None
            and payload is self._last_body
            and holder.segment == placement.segment
        ):
            body = (holder.segment, holder.offset, holder.length)
            record = encode_enqueue_shared(
                message_id,
                queue,
                timestamp,
                body,
                expires,
                exchange=exchange,
                routing_key=routing_key,
            )
            segment, start = placement.append([record], roll=False)
            holder.shared = True
            message = StoredMessage(
                self._journal,
                queue,
                message_id,
                segment,
                (start, start + len(record)),
                (holder.offset, holder.length),
                timestamp,
                expires=expires,
                exchange=exchange,
                routing_key=routing_key,
                shared=True,
                delivery_count=delivery_count,
            )
        else:
            prefix = enqueue_prefix(
                message_id,
                queue,
                timestamp,
                payload,
                expires,
                exchange=exchange,
                routing_key=routing_key,
            )
            segment, start = placement.append([prefix, payload])
            offset = start + len(prefix)
            message = StoredMessage(
                self._journal,
                queue,
                message_id,
                segment,
                (start, offset + len(payload)),
                (offset, len(payload)),
                timestamp,
                expires=expires,
                exchange=exchange,
                routing_key=routing_key,
                delivery_count=delivery_count,
            )
            self._last = message
            self._last_body = payload
        self._ledger.enqueued(segment)
        self._bodies.hold(message, payload)
        placement.batch.messages.append(message)
        if delivery_count:
            self._changes.count(message_id, segment, delivery_count)
        return message

    def relog(self, message: StoredMessage, body: bytes) -> None:
        """Log an archived ``message`` that came back, with its ``body``, as a new enqueue."""
        fresh = self.enqueue(
            message.queue,
            body,
            message.timestamp,
            message.expires,
            exchange=message.exchange,
            routing_key=message.routing_key,
            delivery_count=message.delivery_count,
        )
        message.message_id = fresh.message_id
        message.segment = fresh.segment
        message.record, message.record_end = fresh.record, fresh.record_end
        message.offset = fresh.offset
        message.shared = fresh.shared
        message.archived = False
        message.pinned = None
        self._placement.batch.messages[-1] = message
        self._bodies.hold(message, body)
        if self._last is fresh:
            self._last = message

    def batch_taken(self) -> None:
        """A batch was taken: a later body is written again rather than referred to."""
        self._last = self._last_body = None
