"""When credit a client granted with a consumer's ATTACH starts to count.

A client may grant credit in the same write as its ATTACH, before it has read the reply. If the
first message then follows the reply at once, both can reach the client in one read, and a
client that blocks until its link is open dispatches that message inside the call that opens the
link: RabbitMQ's Python client runs the consumer's handler there, and an exception the handler
raises escapes the constructor (its suite's test of invalid annotations then breaks every later
test). RabbitMQ's queues answer such credit only after a round through the queue's process (a
Raft commit for a quorum queue), so the reply is read alone in practice.

Here such credit waits, once the socket has taken the reply, until the client sends another
frame, which it can only do after it read the reply's bytes or while they were on their way
(proton's blocking receiver grants its credit again right after the link opens), or until
``attach_credit_hold`` seconds have passed, for clients that say nothing more. Credit granted
after the reply went out counts at once. Each connection holds at most its links, each for at
most the hold.

A pure state machine: the time and proton's count of decoded frames are arguments
(tests/unit/gateway/rules/test_credit_hold.py).
"""

from __future__ import annotations

from collections import deque
from typing import Final, Generic, TypeVar

# RabbitMQ answers a quorum queue consumer's first credit after a Raft commit, some milliseconds;
# a client that grants credit again once its link is open (proton's blocking receiver) does so
# well within 50 ms unless its machine starves it, and a client that never does waits this long
# for its first message once per link.
DEFAULT_ATTACH_CREDIT_HOLD: Final = 0.05

L = TypeVar("L")


class CreditHold(Generic[L]):
    """One connection's consumer links whose early credit waits, oldest first."""

    __slots__ = ("_frames", "_held")

    def __init__(self) -> None:
        # (when the hold ends, the link), in the order the holds began.
        self._held: deque[tuple[float, L]] = deque()
        # Proton's count of decoded frames when the last hold began.
        self._frames = 0

    def __bool__(self) -> bool:
        return bool(self._held)

    @property
    def deadline(self) -> float:
        """When the oldest hold ends; 0 when nothing is held."""
        return self._held[0][0] if self._held else 0.0

    def hold(self, link: L, now: float, hold: float, frames: int) -> bool:
        """The socket took ``link``'s ATTACH reply at ``now``, when proton had decoded ``frames``
        frames from the client, and the client had granted credit: False if ``hold`` is 0 and
        the credit counts at once, else True and it waits."""
        if hold <= 0:
            return False
        self._held.append((now + hold, link))
        self._frames = frames
        return True

    def heard(self, frames: int) -> list[L]:
        """Proton has decoded ``frames`` frames in all: one decoded since the holds began
        releases them all."""
        if not self._held or frames == self._frames:
            return []
        released = [link for _, link in self._held]
        self._held.clear()
        return released

    def due(self, now: float) -> list[L]:
        """The links whose hold has ended by ``now``."""
        released = []
        held = self._held
        while held and held[0][0] <= now:
            released.append(held.popleft()[1])
        return released

    def clear(self) -> None:
        """The connection ended: nothing waits any more."""
        self._held.clear()
