"""Bytes of message bodies the server's queues hold in memory, for the memory budget.

One counter is shared by every queue of a server, so the gateway reads the total in O(1) after
each batch of events instead of summing over queues. A queue adds a message's bytes when it
takes the message and subtracts them when the message leaves (archived, dropped, purged);
a durable queue counts only the bodies it keeps cached.
"""

from __future__ import annotations


class HeldBytes:
    """A running total of message bytes held in memory."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0
