"""A DISPOSITION whose outcome proton would copy into more memory than the budget has left
closes its connection before proton decodes it.

Proton copies a DISPOSITION's outcome into every unsettled delivery of its range as it decodes
the frame (wire/disposition_frames.py): one ``modified`` outcome of 100 KB of annotations over
3,000 deliveries held 670 MiB at once, at a 64 MiB budget, before the server saw an event
(issue 31). The copies are at most the frame's size times the deliveries it can reach (its range,
and no more than the connection's unsettled deliveries). While that, with the copies of every
DISPOSITION handed to proton in the same pass of the reactor, fits in what the memory budget has
left (or in :data:`FLOOR`, whatever the budget holds), the frame goes to proton; past
it the connection is closed with ``amqp:resource-limit-exceeded``, what it sent from that read on
is dropped unread, and its unsettled messages go back to their queues, as when any connection
closes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from sluicegate.gateway.conditions import condition
from sluicegate.gateway.rare_warning import CLIENT_BURST, RareWarning
from sluicegate.gateway.state import ConnectionState
from sluicegate.wire.disposition_frames import Disposition, DispositionFrames

__all__ = ["FLOOR", "Copies", "DispositionBound", "unsettled"]

log = logging.getLogger("sluicegate.dispositions")
# A line per connection closed so, within the burst of its kind (gateway/rare_warning.py).
_refused = RareWarning(
    "closing a connection whose DISPOSITION would be copied past the memory budget",
    burst=CLIENT_BURST,
    logger=log,
)

# Copies always allowed, however full the budget: an outcome carrying the largest message
# annotations allowed (64 KiB) over 16 deliveries, or a rejection's error over thousands.
FLOOR: Final = 1024 * 1024


class Copies:
    """The copies proton may make of the DISPOSITIONs handed to it in this pass of the reactor,
    over every connection: they live until the pass's events are handled (their deliveries
    settled), so they are weighed together against the budget's room."""

    __slots__ = ("_room", "taken")

    def __init__(self, room: Callable[[], int]) -> None:
        # What the memory budget has left (Broker).
        self._room = room
        self.taken = 0

    def left(self) -> int:
        """What may still be copied in this pass."""
        return max(self._room(), FLOOR) - self.taken

    def forget(self) -> None:
        """The pass's events were handled: the copies are gone."""
        self.taken = 0


class DispositionBound:
    """One connection's DISPOSITIONs weighed on their way to proton."""

    __slots__ = ("_copies", "_release", "frames", "refused")

    def __init__(self, copies: Copies, release: Callable[[ConnectionState], None]) -> None:
        self.frames = DispositionFrames()
        # The server's ledger of copies, and how to end a connection's sessions (Broker).
        self._copies = copies
        self._release = release
        # Set once a DISPOSITION was refused: nothing the client sends reaches proton again
        # (closing proton's input instead would make its CLOSE say framing-error).
        self.refused = False

    def cut(self) -> tuple[int, bytes] | None:
        """Where the next frame begins in what the client sends next (DispositionFrames.cut);
        None once nothing it sends reaches proton."""
        return None if self.refused else self.frames.cut()

    def admits(self, state: ConnectionState, data: bytes) -> bool:
        """False if ``data`` holds a DISPOSITION too costly for proton: the connection is
        then closed and ``data`` (and all it sends after) must not reach proton."""
        if self.refused:
            return False
        found = self.frames.scan(data)
        if not found:
            return True
        ledger = self._copies
        deliveries: int | None = None
        for disposition in found:
            left = ledger.left()
            copies = disposition.size * disposition.span
            if copies > left:
                if deliveries is None:
                    deliveries = unsettled(state)
                copies = disposition.size * min(disposition.span, deliveries)
                if copies > left:
                    self._refuse(state, disposition, copies, left)
                    return False
            ledger.taken += copies
        return True

    def _refuse(
        self, state: ConnectionState, disposition: Disposition, copies: int, room: int
    ) -> None:
        _refused.happened(
            time.monotonic(),
            f"{disposition.size} bytes over {disposition.span} deliveries would be "
            f"{copies} bytes, over the {room} it has left",
        )
        self.refused = True
        self._release(state)
        connection = state.connection
        connection.condition = condition(
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
