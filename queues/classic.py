"""The classic queue: a FIFO of messages shared round robin by credited consumers.

A message is AVAILABLE, ACQUIRED by one consumer (delivered, unsettled) or ARCHIVED (gone).
AVAILABLE messages are served in publication order. A released message goes back to its
original place: every message taken from the ready FIFO has a lower sequence number than all
messages still in it, so returned messages wait in a heap by sequence number and are always
served before the FIFO. Both structures make every operation O(1) or O(log returned), however
long the queue.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Final

from queues.held_bytes import HeldBytes
from queues.message import Message
from queues.queue_type import ConsumerKey, CreditReply, Dispatch, Outcome, QueueStatistics
from queues.serial import SERIAL_MASK, link_credit_snd

_NO_DISPATCH: Final[list[Dispatch]] = []


class Consumer:
    """One consumer's side of the queue link: its credit and what it holds unsettled."""

    __slots__ = ("ack_required", "credit", "delivery_count", "key", "unacked", "waiting")

    def __init__(self, key: ConsumerKey, ack_required: bool) -> None:
        self.key = key
        self.ack_required = ack_required
        self.delivery_count = 0
        self.credit = 0
        self.unacked: dict[int, Message] = {}
        # True while the consumer sits in the queue's rotation of consumers with credit.
        self.waiting = False


class ClassicQueue:
    """An in-memory queue implementing :class:`queues.queue_type.QueueType`."""

    def __init__(self, name: str, held: HeldBytes | None = None) -> None:
        self.name = name
        # The server-wide count of bytes held, for the memory budget.
        self.held = HeldBytes() if held is None else held
        self._ready: deque[Message] = deque()
        self._returned: list[tuple[int, Message]] = []
        self._ready_bytes = 0
        self._next_seq = 0
        self._consumers: dict[ConsumerKey, Consumer] = {}
        # Consumers with credit, in round-robin order: fair dispatch without scanning them all.
        self._rotation: deque[Consumer] = deque()
        self._published = 0
        self._delivered = 0
        self._acknowledged = 0

    # -- consumers ------------------------------------------------------------------------

    def attach(self, consumer: ConsumerKey, *, ack_required: bool) -> None:
        """Register a consumer with no credit."""
        self._consumers[consumer] = Consumer(consumer, ack_required)

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        """Remove a consumer; unsent messages return as they were, unsettled ones as failed."""
        state = self._consumers.pop(consumer, None)
        if state is None:
            return _NO_DISPATCH
        state.credit = 0
        if state.waiting:
            self._rotation.remove(state)
            state.waiting = False
        for message in unsent:
            state.unacked.pop(message.seq, None)
            self._push_returned(message)
        for message in state.unacked.values():
            self._count_failed_delivery(message)
            self._push_returned(message)
        state.unacked.clear()
        return self._dispatch()

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        """Set a consumer's credit, deliver what it can take, then reply once."""
        state = self._consumers[consumer]
        state.credit = link_credit_snd(delivery_count, credit, state.delivery_count)
        delivered = self._take(state, state.credit)
        if drain and state.credit > 0:
            # AMQP 1.0 §2.6.7: a drained sender advances delivery-count by its unused credit.
            state.delivery_count = (state.delivery_count + state.credit) & SERIAL_MASK
            state.credit = 0
        if state.credit > 0 and not state.waiting:
            state.waiting = True
            self._rotation.append(state)
        elif state.credit == 0 and state.waiting:
            self._rotation.remove(state)
            state.waiting = False
        reply = CreditReply(state.delivery_count, state.credit, self.available, drain)
        return delivered, reply

    # -- messages -------------------------------------------------------------------------

    @property
    def available(self) -> int:
        """Messages ready to be delivered."""
        return len(self._ready) + len(self._returned)

    def enqueue(self, message: Message) -> list[Dispatch]:
        """Append a message; the next consumer with credit in rotation receives it."""
        message.seq = self._next_seq
        self._next_seq += 1
        self._published += 1
        self.held.total += len(message.payload)
        rotation = self._rotation
        if rotation and not self._returned and not self._ready:
            state = rotation.popleft()
            self._give(state, message)
            if state.credit > 0:
                rotation.append(state)
            else:
                state.waiting = False
            return [(state.key, message)]
        self._ready.append(message)
        self._ready_bytes += len(message.payload)
        return _NO_DISPATCH

    def settle(
        self, consumer: ConsumerKey, seqs: list[int], outcome: Outcome, delivery_failed: bool
    ) -> list[Dispatch]:
        """Apply an outcome: accepted and rejected archive, released and modified requeue."""
        state = self._consumers.get(consumer)
        if state is None:
            return _NO_DISPATCH
        unacked = state.unacked
        requeue = outcome is Outcome.RELEASED or outcome is Outcome.MODIFIED
        for seq in seqs:
            message = unacked.pop(seq, None)
            if message is None:
                continue
            if requeue:
                if delivery_failed:
                    self._count_failed_delivery(message)
                self._push_returned(message)
            else:
                self._acknowledged += 1
                self.held.total -= len(message.payload)
        return self._dispatch() if requeue else _NO_DISPATCH

    def purge(self) -> int:
        """Drop every available message; return how many were dropped."""
        count = self.available
        self.held.total -= self._ready_bytes + sum(len(m.payload) for _, m in self._returned)
        self._ready.clear()
        self._returned.clear()
        self._ready_bytes = 0
        return count

    def statistics(self) -> QueueStatistics:
        """Counts for metrics and tests."""
        returned_bytes = sum(len(m.payload) for _, m in self._returned)
        return QueueStatistics(
            name=self.name,
            ready=self.available,
            unacked=sum(len(c.unacked) for c in self._consumers.values()),
            consumers=len(self._consumers),
            ready_bytes=self._ready_bytes + returned_bytes,
            published=self._published,
            delivered=self._delivered,
            acknowledged=self._acknowledged,
        )

    # -- internals ------------------------------------------------------------------------

    def _count_failed_delivery(self, message: Message) -> None:
        before = len(message.payload)
        message.count_failed_delivery()
        self.held.total += len(message.payload) - before

    def _push_returned(self, message: Message) -> None:
        heapq.heappush(self._returned, (message.seq, message))

    def _next_available(self) -> Message | None:
        if self._returned:
            return heapq.heappop(self._returned)[1]
        if self._ready:
            message = self._ready.popleft()
            self._ready_bytes -= len(message.payload)
            return message
        return None

    def _give(self, state: Consumer, message: Message) -> None:
        state.credit -= 1
        state.delivery_count = (state.delivery_count + 1) & SERIAL_MASK
        self._delivered += 1
        if state.ack_required:
            state.unacked[message.seq] = message
        else:
            self._acknowledged += 1
            self.held.total -= len(message.payload)

    def _take(self, state: Consumer, limit: int) -> list[Message]:
        taken: list[Message] = []
        while len(taken) < limit:
            message = self._next_available()
            if message is None:
                break
            self._give(state, message)
            taken.append(message)
        return taken

    def _dispatch(self) -> list[Dispatch]:
        """Hand available messages to consumers with credit, one each in turn."""
        dispatched: list[Dispatch] = []
        rotation = self._rotation
        while rotation and self.available:
            state = rotation.popleft()
            message = self._next_available()
            if message is None:
                rotation.appendleft(state)
                break
            self._give(state, message)
            dispatched.append((state.key, message))
            if state.credit > 0:
                rotation.append(state)
            else:
                state.waiting = False
        return dispatched
