"""What routing one message through exchanges may do, counted as it goes.

A message walks exchange-to-exchange bindings, alternate exchanges and topic tries once for
each of its routing keys (its ``x-cc`` keys too). Bounded per exchange or per match only, the
walk multiplied them: 256 ``x-cc`` keys through a fanout bound to 2,000 exchanges took 368 ms
of the reactor for one message, which routed nowhere and so was charged nothing. Every step of
one message's routing is taken from one :class:`RouteSteps`; past :data:`MAX_ROUTE_STEPS` the
message is refused (``amqp:resource-limit-exceeded``) instead of holding the reactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeAlias

from sluicegate.queues.errors import ResourceLimitExceeded

# Steps one message's routing may take: an exchange visited, a routing key looked up in one,
# a headers pattern or a topic trie's state matched, each some 0.5-7 us (measured on a loaded
# machine), so at most a few tens of ms of the reactor; a message through a chain of 2,000
# exchanges takes some 2,000, and a topic match of a 20-word key in 20,000 bindings a few
# hundred.
MAX_ROUTE_STEPS: Final = 10_000

# Takes steps from one message's routing (:meth:`RouteSteps.take`).
Take: TypeAlias = Callable[[int], None]


class RouteSteps:
    """The steps one message's routing has left."""

    __slots__ = ("left",)

    def __init__(self, limit: int = MAX_ROUTE_STEPS) -> None:
        self.left = limit

    def take(self, steps: int) -> None:
        """Take ``steps``; refuse the message once they are spent."""
        self.left -= steps
        if self.left < 0:
            raise ResourceLimitExceeded(
                f"routing the message would take more than {MAX_ROUTE_STEPS} steps through "
                "its exchanges' bindings"
            )
