"""Bytes of message bodies the server's queues hold in memory, for the memory budget.

One counter is shared by every queue of a server, so the gateway reads the total in O(1) after
each batch of events instead of summing over queues. A queue adds a message with :meth:`take`
when it takes it and :meth:`let_go` when the message leaves (archived, dropped, purged); a
durable queue counts only the bodies it keeps cached.

Copies of one message share its payload (``Message.copy``: a fan-out's queues, a browser's
deliveries): the payload is counted once, by the first copy taken, and refunded by the last one
let go, whatever order they go in; each copy costs its own :data:`MESSAGE_OVERHEAD`. Counting
each copy in full made a fan-out of 50 queues count 50 times what it held, and the budget
blocked every publisher with RSS tens of MiB under it (issue 31, docs/adversary.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from sluicegate.queues.message import Message

# What a queued message costs beyond its bytes, measured with 100-byte bodies on CPython 3.11:
# ~220 bytes ready (the Message and its slots, the bytes header, the queue's log entry) and ~100
# more while unacked (the consumer's dict entry), rounded up. Without it a budget of small
# messages would let RSS grow to several times the budget.
MESSAGE_OVERHEAD: Final = 384


def copies_cost(size: int, copies: int, whole: int = 0) -> int:
    """What ``copies`` copies of a message of ``size`` bytes cost beyond one count of its
    payload: each further copy's overhead, and the payload again for each of the ``whole``
    copies counted with a payload of their own (one crossing to another worker is counted
    whole by its sender until the owner confirms it, ``Remote.in_flight``), but one when
    every copy is. A renewal backed, and a route charged, for the shared payload alone let a
    publisher to a fanout of another worker's queues send N payloads a credit."""
    further = max(copies - 1, 0)
    return further * MESSAGE_OVERHEAD + min(whole, further) * size


def hold_payload(message: Message) -> int:
    """What one more holder of ``message``'s payload adds (a queue's copy, through
    :func:`charge`, or another worker's pre-settled consumer's recent deliveries,
    session/channel/owner.py): the payload, unless a copy sharing it is counted already.
    Counted whole, a fan-out's copies delivered to such a consumer each counted the payload
    its other queues still counted, 30 KB for the 384 B its queue gave back, and took the
    worker 1 MB past its publishers' ceiling (adversary seed 66181). Matched by one
    :func:`release_payload`."""
    share = message.share
    if share is None:
        return message.held
    share.holders += 1
    return 0 if share.holders > 1 else message.held


def release_payload(message: Message) -> int:
    """What letting go of a :func:`hold_payload` takes away: the payload with its last
    holder."""
    share = message.share
    if share is None:
        return message.held
    share.holders -= 1
    return 0 if share.holders else message.held


def charge(message: Message) -> int:
    """What counting ``message`` adds: its bytes, unless a copy sharing them is counted, and
    its overhead. Every :func:`charge` is matched by one :func:`refund` of the message as it
    is (:meth:`HeldBytes.rewrite` for a change of its bytes meanwhile)."""
    return hold_payload(message) + MESSAGE_OVERHEAD


def refund(message: Message) -> int:
    """What no longer counting ``message``, charged before, takes away: the payload's bytes
    go with the last copy sharing them."""
    return release_payload(message) + MESSAGE_OVERHEAD


class HeldBytes:
    """A running total of message bytes held in memory: every message a queue holds is
    counted through :meth:`take` and :meth:`let_go` (or :func:`charge` and :func:`refund`)."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0

    def take(self, message: Message) -> None:
        """Count ``message`` (:func:`charge`, inlined for the one alone with its payload)."""
        if message.share is None:
            self.total += message.held + MESSAGE_OVERHEAD
        else:
            self.total += charge(message)

    def let_go(self, message: Message) -> None:
        """Stop counting ``message``, taken before (:func:`refund`, inlined likewise)."""
        if message.share is None:
            self.total -= message.held + MESSAGE_OVERHEAD
        else:
            self.total -= refund(message)

    def take_all(self, messages: Iterable[Message]) -> None:
        """:meth:`take` for each of ``messages``."""
        self.total += sum(map(charge, messages))

    def let_go_all(self, messages: Iterable[Message]) -> int:
        """:meth:`let_go` for each of ``messages``, in one pass: a consumer settles thousands
        in one DISPOSITION, and the common message, alone with its payload, costs no call.
        Returns what they held, each counted whole (``Message.held``): what a consumer's
        unacked bytes lose as it accepts them (queues/settlement.py), read in the same pass."""
        freed = whole = count = 0
        for message in messages:
            count += 1
            size = message.held
            whole += size
            share = message.share
            if share is None:
                freed += size
            else:
                share.holders -= 1
                if not share.holders:
                    freed += size
        self.total -= freed + count * MESSAGE_OVERHEAD
        return whole

    def rewrite(self, message: Message, change: Callable[[], None]) -> None:
        """Run ``change`` on a counted message, which may give it new bytes: it is counted
        again as it is after, out of its share if the change made it leave one."""
        self.let_go(message)
        try:
            change()
        finally:
            self.take(message)
