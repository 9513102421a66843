"""A DISPOSITION whose outcome proton would copy into more memory than the budget has left
closes its connection before proton decodes it.

Proton copies a DISPOSITION's outcome into every unsettled delivery of its range as it decodes
the frame (wire/disposition_frames.py): one ``modified`` outcome of 100 KB of annotations over
3,000 deliveries held 670 MiB at once, at a 64 MiB budget, before the server saw an event
(issue 31). The copies are at most the frame's size times the deliveries it can reach (its range,
and no more than the connection's unsettled deliveries). While that fits in what the memory
budget has left (or in :data:`FLOOR`, whatever the budget holds), the frame goes to proton; past
it the connection is closed with ``amqp:resource-limit-exceeded``, what it sent from that read on
is dropped unread, and its unsettled messages go back to their queues, as when any connection
closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from proton import Condition

from sluicegate.gateway.state import ConnectionState
from sluicegate.wire.disposition_frames import Disposition, DispositionFrames

__all__ = ["FLOOR", "DispositionBound", "unsettled"]

log = logging.getLogger("sluicegate.dispositions")

# Copies always allowed, however full the budget: an outcome carrying the largest message
# annotations allowed (64 KiB) over 16 deliveries, or a rejection's error over thousands.
FLOOR: Final = 1024 * 1024


class DispositionBound:
    """One connection's DISPOSITIONs weighed on their way to proton."""

    __slots__ = ("_release", "_room", "frames", "refused")

    def __init__(self, room: Callable[[], int], release: Callable[[ConnectionState], None]) -> None:
        self.frames = DispositionFrames()
        # What the memory budget has left, and how to end a connection's sessions (Broker).
        self._room = room
        self._release = release
        # Set once a DISPOSITION was refused: nothing the client sends reaches proton again
        # (closing proton's input instead would make its CLOSE say framing-error).
        self.refused = False

    def admits(self, state: ConnectionState, data: bytes) -> bool:
        """False if ``data`` holds a DISPOSITION too costly for proton: the connection is
        then closed and ``data`` (and all it sends after) must not reach proton."""
        if self.refused:
            return False
        found = self.frames.scan(data)
        if not found:
            return True
        room = max(self._room(), FLOOR)
        deliveries: int | None = None
        for disposition in found:
            if disposition.size * disposition.span <= room:
                continue
            if deliveries is None:
                deliveries = unsettled(state)
            copies = disposition.size * min(disposition.span, deliveries)
            if copies > room:
                self._refuse(state, disposition, copies, room)
                return False
        return True

    def _refuse(
        self, state: ConnectionState, disposition: Disposition, copies: int, room: int
    ) -> None:
        log.warning(
            "closing a connection whose DISPOSITION of %d bytes over %d deliveries would be "
            "copied to %d bytes, over the %d the memory budget has left",
            disposition.size,
            disposition.span,
            copies,
            room,
        )
        self.refused = True
        self._release(state)
        connection = state.connection
        connection.condition = Condition(
            "amqp:resource-limit-exceeded",
            f"a disposition of {disposition.size} bytes over {disposition.span} deliveries "
            f"needs {copies} bytes; the server's memory budget has {room} left",
        )
        connection.close()


def unsettled(state: ConnectionState) -> int:
    """The connection's deliveries to consumers not settled yet: all a DISPOSITION can reach."""
    return sum(
        link.unsettled
        for session in state.sessions.values()
        for link in session.pure.links.values()
    )
