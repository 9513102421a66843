"""What a full classic queue does (``x-max-length``, ``x-max-length-bytes``, ``x-overflow``).

``drop-head`` (the default) drops the oldest available messages until the queue is within its
limits again, dead-lettering them with reason ``maxlen``. ``reject-publish`` refuses the new
message instead (the publisher is told ``rejected``); ``reject-publish-dlx`` also dead-letters
the refused message.
"""

from __future__ import annotations

from sluicegate.queues.arguments import Overflow, QueueArguments
from sluicegate.queues.backlog import Backlog
from sluicegate.queues.dead_lettering import MAXLEN, DeadLetterer
from sluicegate.queues.message import Message
from sluicegate.queues.ordering import Ordering


class Limits:
    """A queue's length limits and what it does when they are reached."""

    __slots__ = ("max_bytes", "max_length", "overflow")

    def __init__(self, arguments: QueueArguments) -> None:
        self.max_length = arguments.max_length
        self.max_bytes = arguments.max_length_bytes
        self.overflow = arguments.overflow

    def refuses(self, backlog: Backlog, message: Message, dead_letterer: DeadLetterer) -> bool:
        """True when a reject-publish queue has no room for ``message`` (dead-lettered if
        the queue says ``reject-publish-dlx``)."""
        if self.overflow is Overflow.DROP_HEAD:
            return False
        max_length = self.max_length
        max_bytes = self.max_bytes
        full = (max_length is not None and backlog.ready >= max_length) or (
            max_bytes is not None and backlog.ready_bytes + message.read_size() > max_bytes
        )
        if full and self.overflow is Overflow.REJECT_PUBLISH_DLX:
            dead_letterer.send(message, MAXLEN, queued=False)
        return full

    def drop_head(
        self, backlog: Backlog, order: Ordering, now: int, dead_letterer: DeadLetterer
    ) -> int:
        """Drop the oldest available messages until the queue is within its limits: how many."""
        max_length = self.max_length
        max_bytes = self.max_bytes
        dropped = 0
        while (max_length is not None and backlog.ready > max_length) or (
            max_bytes is not None and backlog.ready_bytes > max_bytes
        ):
            message = order.next(now)
            if message is None:
                break
            dropped += 1
            dead_letterer.send(message, MAXLEN)
        return dropped
