"""A consumer's filters together: a message must pass every one (AMQP 1.0 §3.5.8)."""

from __future__ import annotations

from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import MessageFilter


class AllOf:
    """Several filters of one consumer, tried in order until one refuses."""

    __slots__ = ("filters",)

    def __init__(self, filters: list[MessageFilter]) -> None:
        self.filters = filters

    def __call__(self, message: Message) -> bool:
        """True when every filter accepts the message."""
        return all(accept(message) for accept in self.filters)


def all_of(filters: list[MessageFilter]) -> MessageFilter | None:
    """The one filter that applies ``filters``, or None when there are none."""
    if not filters:
        return None
    return filters[0] if len(filters) == 1 else AllOf(filters)
