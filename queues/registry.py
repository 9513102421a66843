"""The server's queues by name: declared on first use, looked up on every attach."""

from __future__ import annotations

from queues.classic import ClassicQueue
from queues.held_bytes import HeldBytes
from queues.queue_type import QueueStatistics


class QueueRegistry:
    """All queues of one server."""

    def __init__(self) -> None:
        self._queues: dict[str, ClassicQueue] = {}
        # Bytes every queue holds in memory, for the server's memory budget.
        self.held = HeldBytes()

    def declare(self, name: str) -> ClassicQueue:
        """Return the queue called ``name``, creating an in-memory classic queue if absent."""
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = ClassicQueue(name, self.held)
        return queue

    def get(self, name: str) -> ClassicQueue | None:
        """Return the queue called ``name`` if it exists."""
        return self._queues.get(name)

    def statistics(self) -> list[QueueStatistics]:
        """Every queue's counts, by name."""
        return [self._queues[name].statistics() for name in sorted(self._queues)]
