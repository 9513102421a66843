"""The message annotations of consumers' ``modified`` outcomes: measured, shared, and refused
when the server's memory budget has no room for them.

A client settling a range of deliveries with one ``modified`` DISPOSITION carrying annotations
makes proton raise an event per delivery, each with its own copy of the annotations. Read one
by one, a 100 KB annotation over 3,000 deliveries was checked and kept 3,000 times, each message
of the range grew by it, and the growth went uncounted (a durable queue keeps the annotations
beside the body): RSS went from 43 to 709 MiB under a 64 MiB budget. Here:

- annotations larger than ``max_message_annotations_size`` are refused before they are decoded
  (the link is closed with ``amqp:link:message-size-exceeded``, as a publisher's would be
  rejected);
- the deliveries of a range that carry the same annotations share one checked copy: only the
  first is decoded, and a durable message keeps that copy itself (queues/log/stored.py);
- each message that takes them is charged their size in the server's count of held bytes
  (queues/settlement.py ``rewrite``), so the memory budget sees them; when the bytes held would
  pass the budget's resume mark (80 % of its limit), or the budget is already blocked, the
  outcome is refused with ``amqp:resource-limit-exceeded`` and the consumer's link closed: the
  messages it had not settled go back unchanged when the link detaches, and nothing grew.
  Annotations alone never block the server, so publishers are not held by them.
"""

from __future__ import annotations

from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.annotations import InvalidAnnotations, modified_annotations


class NoRoomForAnnotations(InvalidAnnotations):
    """The memory budget cannot take a ``modified`` outcome's annotations."""

    condition = "amqp:resource-limit-exceeded"


class ModifiedAnnotations:
    """Checks ``modified`` outcomes' annotations, the last ones checked kept for the range."""

    __slots__ = ("_budget", "_held", "_last", "limit")

    def __init__(self, limit: int, budget: MemoryBudget, held: HeldBytes) -> None:
        self.limit = limit
        self._budget = budget
        # The server's count of bytes held in queues, live while a range is applied (the
        # budget's own count is refreshed once per reactor pass).
        self._held = held
        # The last annotations checked, as the client encoded them: at most ``limit`` bytes.
        self._last: bytes | None = None

    def checked(self, encoded: bytes | None) -> bytes | None:
        """The annotations to merge into one delivery's message; None if there are none.

        Raises :class:`~wire.annotations.InvalidAnnotations` (or a subclass) when the outcome
        must be refused: malformed, too large, or no room left in the budget.
        """
        if encoded is None:
            return None
        last = self._last
        if last is not None and last == encoded:
            annotations: bytes | None = last
        else:
            annotations = modified_annotations(encoded, self.limit)
            self._last = annotations
        if annotations is None:
            return None
        budget = self._budget
        if budget.blocked or self._held.total + len(annotations) > budget.resume_at:
            raise NoRoomForAnnotations(
                "modified outcome: the server's memory budget is full; message-annotations of "
                f"{len(annotations)} bytes refused"
            )
        return annotations

    def forget(self) -> None:
        """The range is over: keep nothing."""
        self._last = None
