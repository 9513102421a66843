"""Queue leases (``x-expires``): a queue unused for that long is deleted, as in RabbitMQ.

Use is a declaration or redeclaration, a ``stat`` (the counts a management
``GET /queues/NAME`` returns), or the last consumer leaving; while consumers are attached the
queue is in use. Publishing does not count. Every countdown restarts when the server starts
serving, as RabbitMQ's queues count from their own start after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Lease:
    """A queue's x-expires countdown: it is deleted once unused for ``expires`` milliseconds."""

    expires: int
    # When it was last used: declared, redeclared, or left by a consumer.
    last_used: int

    @property
    def deadline(self) -> int:
        """When the queue goes if nothing uses it before."""
        return self.last_used + self.expires


class Leases:
    """The leases of the queues declared with x-expires, by queue name."""

    __slots__ = ("_leases",)

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}

    def grant(self, name: str, expires: int, now: int) -> None:
        """A queue declared with x-expires: its countdown starts ``now``."""
        self._leases[name] = Lease(expires, now)

    def release(self, name: str) -> None:
        """The queue is gone."""
        self._leases.pop(name, None)

    def renew(self, name: str, now: int) -> None:
        """The queue was used: its countdown restarts ``now`` (nothing if it has no lease)."""
        lease = self._leases.get(name)
        if lease is not None:
            lease.last_used = now

    def renew_all(self, now: int) -> None:
        """Restart every countdown ``now``: the server starts serving."""
        for lease in self._leases.values():
            lease.last_used = now

    def due(self, now: int) -> list[str]:
        """The queues whose countdown ran out at ``now``."""
        return [name for name, lease in self._leases.items() if lease.deadline <= now]

    def next_deadline(self) -> int | None:
        """The earliest time a queue may go."""
        return min((lease.deadline for lease in self._leases.values()), default=None)
