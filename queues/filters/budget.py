"""The work a queue may spend on consumer filters in one call, whatever its backlog.

A filtered consumer skips what it does not match, and a filter that matches nothing would walk
the whole backlog in one credit request: with 100,000 messages and a few such consumers, seconds
of the reactor. So every walk that runs filters, and a browser's, draws on a :class:`ReadBudget`:
a unit per step that costs O(1) (a stream chunk skipped, a digest compared, a classic queue's
message or gap not taken, a release read from its log), :data:`EVALUATION_COST` per message
a filter reads, plus the bytes the filter decoded (queues.filters.view) and the work its
evaluation measured (the nodes called, the characters compared and matched: the view cache's
``work``, queues.filters.expression), so one evaluation costs what it did. When the budget is
spent, the walk stops where it is and the queue goes on at the next tick of its clock, after
the reactor has served other clients.
"""

from __future__ import annotations

from typing import Final

from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import MessageFilter

# Units per call: some 500 evaluations of small messages, a few milliseconds of the reactor.
READ_BUDGET: Final = 4096
# A filter's evaluation, in units, beside the decoding it caused; one unit per
# DECODED_BYTES_PER_UNIT encoded bytes decoded, the rate at which the densest maps decode, so
# one message of the largest application-properties allowed (64 KiB) may use a whole budget.
EVALUATION_COST: Final = 8
DECODED_BYTES_PER_UNIT: Final = 8


class ReadBudget:
    """Units of work left for filters in the current call."""

    __slots__ = ("units",)

    def __init__(self, units: int = READ_BUDGET) -> None:
        self.units = units

    def refill(self) -> None:
        """A new call: the whole budget again."""
        self.units = READ_BUDGET

    @property
    def spent(self) -> bool:
        """True when the walk must stop and go on later."""
        return self.units <= 0

    def passes(self, accept: MessageFilter, message: Message, views: ViewCache | None) -> bool:
        """Run a filter on a message and charge what it cost."""
        if views is None:
            passed = accept(message)
            self.units -= EVALUATION_COST
            return passed
        decoded, work = views.decoded_bytes, views.work
        passed = accept(message)
        self.units -= (
            EVALUATION_COST
            + (views.decoded_bytes - decoded) // DECODED_BYTES_PER_UNIT
            + views.work
            - work
        )
        return passed
