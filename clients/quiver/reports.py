"""What the sender and receiver processes tell the process that runs them, and how.

Two channels, each for what it is good at: a duplex pipe per process for the few events that
matter once (ready, failed, done, and the parent's stop), and a shared scoreboard of counters each
process overwrites on its timer, which the parent reads for status rows and the no-progress
timeout without a message per update.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from typing import Final

__all__ = [
    "STOP",
    "Failed",
    "Ready",
    "ReceiverDone",
    "Report",
    "Scoreboard",
    "SenderDone",
]

STOP: Final[str] = "stop"  # parent → receiver: every expected message has arrived somewhere


@dataclass(frozen=True, slots=True)
class Ready:
    """A receiver's link is attached (or it listens, peer to peer): senders may start."""

    name: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The process gave up; ``reason`` is the one line the user sees."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class SenderDone:
    """A sender's totals; ``accepted`` counts outcomes, 0 when sending presettled.

    ``cpu_s`` is the process's CPU time from the start of its run (imports left out), for the
    clients' cost per message.
    """

    name: str
    sent: int
    accepted: int
    first_ns: int | None
    last_ns: int | None
    cpu_s: float


@dataclass(frozen=True, slots=True)
class ReceiverDone:
    """A receiver's totals; ``latencies`` is an ``array('q')`` of nanoseconds, as bytes.

    ``stale`` counts messages left over from an earlier run, drained and not measured;
    ``cpu_s`` is as in ``SenderDone``.
    """

    name: str
    received: int
    stale: int
    first_ns: int | None
    last_ns: int | None
    latencies: bytes
    cpu_s: float


Report = Ready | Failed | SenderDone | ReceiverDone


class Scoreboard:
    """Per-process counters in shared memory: written by one process each, read by the parent.

    Plain 64-bit slots without locks: each slot has one writer and a torn read is impossible for
    aligned 8-byte words on the platforms proton builds on.
    """

    def __init__(self, context: SpawnContext, processes: int) -> None:
        self.counts = context.RawArray("q", processes)  # messages sent or received
        # sender: outcomes received; receiver: stale messages drained (progress, not results)
        self.settled = context.RawArray("q", processes)
        self.latency_ns = context.RawArray("q", processes)  # receiver: its latest latency

    def total(self, slots: range) -> int:
        """Messages handled by the processes in ``slots``."""
        return int(sum(self.counts[i] for i in slots))

    def progress(self) -> int:
        """A number that grows whenever any process moves; the no-progress timeout watches it."""
        return int(sum(self.counts) + sum(self.settled))
