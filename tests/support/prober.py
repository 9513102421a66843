"""A prober: another real client that keeps being served (or not) while a test attacks the server.

Each round opens a new connection, publishes one message to its own queue, consumes it and
closes, timing the whole round: a reactor stalled by an attacker shows as a slow or failed round
even when the prober's socket was accepted. Rounds run back to back in a thread until
:meth:`Prober.stop`, which returns what the prober saw.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Self

from proton import Message
from proton.utils import BlockingConnection

# Longer than any round of a served prober (about 0.05 s idle, under a second on a loaded
# machine) and far shorter than the stalls the attacks caused (tens of seconds).
ROUND_TIMEOUT: Final = 10.0


@dataclass
class Probed:
    """What the prober saw: each round's seconds, and the errors of failed rounds."""

    rounds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def worst(self) -> float:
        """The slowest round, failed ones included (they count as their time to fail)."""
        return max(self.rounds, default=0.0)


def probe_once(url: str, address: str, timeout: float = ROUND_TIMEOUT) -> float:
    """Connect, publish one message, consume it, close: the seconds it took."""
    start = time.monotonic()
    connection = BlockingConnection(url, timeout=timeout)
    try:
        connection.create_sender(address).send(Message(body="probe"))
        receiver = connection.create_receiver(address, credit=1)
        message = receiver.receive(timeout)
        receiver.accept()
        if message.body != "probe":
            raise AssertionError(f"the prober got {message.body!r}")
    finally:
        connection.close()
    return time.monotonic() - start


class Prober(threading.Thread):
    """Probe ``url`` round after round until stopped; use as a context manager."""

    def __init__(self, url: str, address: str = "/queues/prober") -> None:
        super().__init__(name="prober", daemon=True)
        self.url = url
        self.address = address
        self.seen = Probed()
        self._stopping = threading.Event()

    def run(self) -> None:
        """Rounds back to back; a failed round is recorded and the next one starts."""
        while not self._stopping.is_set():
            start = time.monotonic()
            try:
                self.seen.rounds.append(probe_once(self.url, self.address))
            except Exception as error:
                self.seen.rounds.append(time.monotonic() - start)
                self.seen.failures.append(repr(error))

    def wait_rounds(self, count: int, timeout: float) -> None:
        """Wait until ``count`` rounds are done (served or failed) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while len(self.seen.rounds) < count and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> Probed:
        """Let the round under way finish and return every round's result."""
        self._stopping.set()
        self.join(ROUND_TIMEOUT * 3)
        assert not self.is_alive(), "the prober's last round did not end"
        return self.seen

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
