"""A message as the server holds it: the publisher's encoded bytes and the fields it acts on."""

from __future__ import annotations

from queues.sections import with_delivery_count


class Message:
    """One enqueued message; ``seq`` orders it within its queue and tags its deliveries.

    ``payload`` is exactly what goes on the wire. It starts as the publisher's bytes and is
    re-encoded only when a failed delivery raises the header's delivery-count (AMQP 1.0 §3.2.1).
    """

    __slots__ = ("delivery_count", "payload", "seq")

    def __init__(self, payload: bytes, delivery_count: int = 0, seq: int = 0) -> None:
        self.payload = payload
        self.delivery_count = delivery_count
        self.seq = seq

    @property
    def size(self) -> int:
        """Bytes the message occupies on the wire and in memory."""
        return len(self.payload)

    def count_failed_delivery(self) -> None:
        """Record one more failed delivery attempt in the header the next consumer sees."""
        self.delivery_count += 1
        self.payload = with_delivery_count(self.payload, self.delivery_count)
