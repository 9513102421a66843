"""What handing messages to a consumer does to them: the other half of :mod:`queues.settlement`.

A consumer that settles acquires each message it is given, and with a ``consumer_timeout`` the
delivery gets a lock deadline (:mod:`queues.deadlines`); one that settles nothing (settled
mode) has the message archived as it is handed out, consumed at once; a browser only sees it.
Either way the consumer spends a credit and its delivery-count moves on (AMQP 1.0 §2.6.7). The
queue picks the messages (:mod:`queues.classic`); this counts them for its statistics.
"""

from __future__ import annotations

from sluicegate.queues.backlog import Backlog
from sluicegate.queues.consumers import Consumer
from sluicegate.queues.deadlines import Deadlines
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.log.stored import acquire_all
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.wire.serial import SERIAL_MASK


class HandOut:
    """One queue's hand-outs: messages given to its consumers, and how many."""

    __slots__ = ("_backlog", "_clock", "_deadlines", "_held", "archived", "delivered")

    def __init__(
        self, backlog: Backlog, deadlines: Deadlines, clock: Clock, held: HeldBytes
    ) -> None:
        self._backlog = backlog
        self._deadlines = deadlines
        self._clock = clock
        self._held = held
        # Messages handed out, and those of them archived at once (settled mode).
        self.delivered = 0
        self.archived = 0

    def give(self, consumer: Consumer, message: Message) -> Message:
        """Hand one message to ``consumer``: acquired, or archived at once in settled mode."""
        consumer.credit -= 1
        consumer.delivery_count = (consumer.delivery_count + 1) & SERIAL_MASK
        self.delivered += 1
        if consumer.browse:
            return message
        message.acquire()
        backlog = self._backlog
        backlog.ready -= 1
        backlog.ready_bytes -= message.read_size()
        if consumer.ack_required:
            consumer.unacked[message.seq] = message
            consumer.unacked_bytes += message.held
            deadlines = self._deadlines
            if deadlines.timeout is not None:
                deadlines.lock(message, consumer, self._clock.now)
        else:
            self.archived += 1
            backlog.archive(message, sending=True)
        return message

    def give_all(self, consumer: Consumer, taken: list[Message]) -> None:
        """:meth:`give` for a batch the queue's order took for a consumer that neither browses
        nor has lock deadlines: the hot path of consuming, its counts added up once per batch."""
        backlog = self._backlog
        messages = backlog.messages
        size_taken = 0
        ack_required = consumer.ack_required
        if ack_required:
            unacked = consumer.unacked
            held_taken = 0
            for message in taken:
                size_taken += message.read_size()
                held_taken += message.held
                unacked[message.seq] = message
            consumer.unacked_bytes += held_taken
            acquire_all(taken)
        else:
            self._held.let_go_all(taken)
            for message in taken:
                size_taken += message.read_size()
                message.archive(sending=True)
                del messages[message.seq]
        count = len(taken)
        if count:
            consumer.credit -= count
            consumer.delivery_count = (consumer.delivery_count + count) & SERIAL_MASK
            self.delivered += count
            backlog.ready -= count
            backlog.ready_bytes -= size_taken
            if not ack_required:
                self.archived += count
