"""The owner's side of a channel: remote consumers of this worker's queues.

The queues see a remote consumer as any other consumer key (:class:`RemoteConsumer`); what they
dispatch to one becomes :class:`~.frames.Deliveries` frames instead of entries in a session's
``outgoing_pending``, and the one reply of every credit request follows its deliveries, as it
does locally. Every count crossing the channel goes through the consumer's
:class:`~.ends.QueueEnd` first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import (
    ConsumerOptions,
    Dispatch,
    LockExpired,
    Outcome,
    QueueType,
)
from sluicegate.session.channel.codec import ChannelError
from sluicegate.session.channel.ends import QueueEnd
from sluicegate.session.channel.frames import (
    Attach,
    Credit,
    Deliveries,
    Detach,
    Error,
    Frame,
    Settle,
    Settled,
)
from sluicegate.wire.serial import SERIAL_MASK, serial_diff

OUTCOMES: Final = {
    Settled.ACCEPTED: Outcome.ACCEPTED,
    Settled.RELEASED: Outcome.RELEASED,
    Settled.REJECTED: Outcome.REJECTED,
    Settled.MODIFIED: Outcome.MODIFIED,
}
# Finds a queue this worker owns by virtual host and name.
FindQueue = Callable[[str, str], QueueType | None]


class RemoteConsumer:
    """A consumer across the channel, as its queue knows it.

    ``recent`` keeps the last deliveries sent with the delivery-count each took the consumer
    to: the session may hand them back unsent when the consumer detaches, or never have seen
    them (they crossed its DETACH), and either way they return as they were, as locally. The
    session holds at most one batch per consumer (``max_queue_credit``, session/outbound.py),
    so twice that many covers a batch and the deliveries that crossed its next request.
    """

    __slots__ = ("__weakref__", "end", "queue", "recent")

    def __init__(self, end: QueueEnd, queue: QueueType, keep: int) -> None:
        self.end = end
        self.queue = queue
        self.recent: deque[tuple[int, Message]] = deque(maxlen=keep)


class Owner:
    """Frames from a channel's session side, applied to this worker's queues."""

    def __init__(self, find: FindQueue, max_queue_credit: int) -> None:
        self.find = find
        self.keep = 2 * max_queue_credit
        self.consumers: dict[int, RemoteConsumer] = {}

    def receive(self, frame: Frame) -> tuple[list[Frame], list[Dispatch]]:
        """Apply one frame; the frames to send back and the dispatches for this worker's own
        consumers (a settlement or a detach may hand a message to any consumer)."""
        if type(frame) is Credit:
            return self._credit(frame), []
        if type(frame) is Settle:
            return self._settle(frame)
        if type(frame) is Attach:
            return self._attach(frame), []
        if type(frame) is Detach:
            return self._detach(frame)
        raise ChannelError(f"a {type(frame).__name__} frame sent to a queue's owner")

    def route(self, dispatches: list[Dispatch]) -> tuple[list[Frame], list[Dispatch]]:
        """Split a queue's dispatches: deliveries frames for this channel's consumers (one per
        run of one consumer's messages), the rest for the worker's sessions."""
        frames: list[Frame] = []
        local: list[Dispatch] = []
        run: list[Message] = []
        current: RemoteConsumer | None = None
        for key, message in dispatches:
            if type(key) is not RemoteConsumer or self.consumers.get(key.end.consumer) is not key:
                local.append((key, message))
                continue
            if key is not current:
                if current is not None:
                    frames.append(self._deliveries(current, run))
                current, run = key, []
            run.append(message)
        if current is not None:
            frames.append(self._deliveries(current, run))
        return frames, local

    def close(self) -> list[Dispatch]:
        """The channel ended: every remote consumer detaches, nothing it held sent on."""
        dispatches: list[Dispatch] = []
        for consumer in list(self.consumers):
            # The session's worker is gone and cannot say what reached its clients: all of it
            # counts as sent, so an at-most-once consumer's message is never delivered twice
            # and an unsettled one comes back as after a lost connection.
            seen = self.consumers[consumer].end.delivery_count
            dispatches.extend(self._detach(Detach(consumer, seen))[1])
        return dispatches

    # -- frames ---------------------------------------------------------------------------

    def _attach(self, frame: Attach) -> list[Frame]:
        if frame.consumer == 0 or frame.consumer in self.consumers:
            raise ChannelError(f"consumer {frame.consumer} attached twice")
        if frame.filters:
            return [Error(frame.consumer, "amqp:not-implemented", "filters across workers")]
        queue = self.find(frame.vhost, frame.queue)
        if queue is None:
            return [
                Error(
                    frame.consumer,
                    "amqp:not-found",
                    f"no queue '{frame.queue}' in vhost '{frame.vhost}'",
                )
            ]
        key = RemoteConsumer(QueueEnd(frame.consumer, frame.ack_required), queue, self.keep)
        queue.attach(
            key,
            ack_required=frame.ack_required,
            options=ConsumerOptions(browse=frame.browse, priority=frame.priority),
        )
        self.consumers[frame.consumer] = key
        return []

    def _consumer(self, consumer: int) -> RemoteConsumer:
        key = self.consumers.get(consumer)
        if key is None:
            raise ChannelError(f"consumer {consumer} is not attached")
        return key

    def _credit(self, frame: Credit) -> list[Frame]:
        key = self._consumer(frame.consumer)
        end = key.end
        end.granted(frame)
        messages, reply = key.queue.credit(key, frame.delivery_count, frame.credit, frame.drain)
        frames: list[Frame] = [self._deliveries(key, messages)] if messages else []
        frames.append(end.reply(frame, reply.delivery_count, reply.credit, reply.available))
        return frames

    def _settle(self, frame: Settle) -> tuple[list[Frame], list[Dispatch]]:
        key = self._consumer(frame.consumer)
        seqs = key.end.settled(frame)
        errors: list[Frame] = []
        try:
            dispatches = key.queue.settle(
                key,
                seqs,
                OUTCOMES[frame.outcome],
                frame.delivery_failed,
                undeliverable_here=frame.undeliverable_here,
                annotations=frame.annotations,
            )
        except LockExpired as error:
            dispatches = error.dispatches
            errors.append(Error(frame.consumer, error.condition, str(error)))
        frames, local = self.route(dispatches)
        return errors + frames, local

    def _detach(self, frame: Detach) -> tuple[list[Frame], list[Dispatch]]:
        key = self.consumers.pop(frame.consumer, None)
        if key is None:
            return [], []
        wanted = set(frame.unsent)
        seen = frame.delivery_count
        unsent = [
            message
            for count, message in key.recent
            if message.seq in wanted or serial_diff(count, seen) > 0
        ]
        key.recent.clear()
        return self.route(key.queue.detach(key, unsent))

    def _deliveries(self, key: RemoteConsumer, messages: list[Message]) -> Deliveries:
        end = key.end
        count = end.delivery_count
        end.sending(len(messages))
        recent = key.recent
        for message in messages:
            count = (count + 1) & SERIAL_MASK
            recent.append((count, message))
        return Deliveries(
            key.end.consumer,
            tuple(message.seq for message in messages),
            tuple(message.send() for message in messages),
        )
