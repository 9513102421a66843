"""Which worker owns each queue: a stable hash of its virtual host and name, recorded once.

A queue's messages live in its owner's log (``<data>/worker-K/``), so a queue must not move
when the number of workers changes. The hash only proposes a home for a queue placed for the
first time; the home is then recorded (one line appended to the placement file every worker
shares under a lock, gateway/queue_homes_file.py) and read back at every start, whatever the
number of workers.
With more workers, recorded queues stay where they are and new ones spread over all. With
fewer, a queue recorded on a worker that no longer exists would lose its log: the server
refuses to start and names those queues (:meth:`Homes.stranded`) until they are moved by an
explicit step (``sluicegate placement move``, :meth:`Homes.rehome`), not by a restart.

The hash is Lamping and Veach's jump consistent hash over a BLAKE2b digest: Python's ``hash``
differs between processes, and a jump hash proposes the same home for all but ``1/N`` of the
names when ``N`` grows by one, so an explicit rebalance moves as few queues as possible.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from sluicegate.queues.queue_type import QueueType

# The jump hash's linear congruential step (Lamping and Veach, "A Fast, Minimal Memory,
# Consistent Hash Algorithm", 2014).
_LCG: Final = 2862933555777941757
_MASK64: Final = (1 << 64) - 1


class OwnerDeclared(enum.Enum):
    """Where a management declaration of a queue another worker owns stands
    (:meth:`Placement.owner_declares`)."""

    # Asked of the owner: the request is answered again once it answered.
    ASKED = "asked"
    # The owner made the queue with this declaration.
    MADE = "made"
    # The owner had it: its settings, replicated here before its answer, judge the declaration.
    HAD = "had"


class Placement(Protocol):
    """What a virtual host's registry asks when the server runs on several workers: where a
    queue lives, and who else must hear of a change (gateway/peers.py)."""

    def remote(self, name: str) -> QueueType | None:
        """The queue as another worker's (placing it first if it is new); None if it lives
        here."""

    def changed(self, change: list[object]) -> None:
        """A queue, exchange or binding changed here (its verb first): every worker applies
        it, so that routing stays local to each."""

    def used(self, name: str) -> None:
        """A client used the queue ``name``, which another worker owns (redeclared it, read its
        stat): its x-expires countdown, kept by its owner, restarts."""

    def owner_deletes(self, name: str) -> int | None:
        """Management deletes ``name``: if another worker owns it and a management request is
        being answered, its owner deletes it and the count of ready messages it deleted is
        returned (0 until it answered: the request is answered again then). None otherwise: the
        queue is deleted here."""

    def owner_declares(
        self, name: str, arguments: Mapping[str, object], *, durable: bool, auto_delete: bool
    ) -> OwnerDeclared | None:
        """Management declares ``name``, which this worker does not know or holds as a
        stand-in: if another worker owns it and a management request is being answered, its
        owner judges the declaration (two workers declaring it at once with different arguments
        cannot both win). None otherwise: the queue is declared here."""

    def owner_declares_exchange(
        self,
        name: str,
        type_name: str,
        arguments: Mapping[str, object],
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
    ) -> OwnerDeclared | None:
        """Management declares the exchange ``name``, which this worker does not know: if
        another worker judges it (the one :func:`proposed_home` names for it) and a management
        request is being answered, that worker judges the declaration, so that two workers
        declaring it at once with different types or flags cannot both win. None otherwise:
        the exchange is declared here."""


class HomesDamaged(Exception):
    """A placement record that cannot be read: the file was changed by hand or damaged."""


def proposed_home(vhost: str, name: str, workers: int) -> int:
    """The worker, ``0 <= K < workers``, that a queue placed now would live on."""
    if workers < 1:
        raise ValueError("there is at least one worker")
    digest = hashlib.blake2b(f"{vhost}\0{name}".encode(), digest_size=8).digest()
    key = int.from_bytes(digest, "little")
    bucket, jump = -1, 0
    while jump < workers:
        bucket = jump
        key = (key * _LCG + 1) & _MASK64
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


class Homes:
    """Every queue's recorded home, and the records that keep them."""

    __slots__ = ("homes", "workers")

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("there is at least one worker")
        self.workers = workers
        self.homes: dict[tuple[str, str], int] = {}

    def home(self, vhost: str, name: str) -> int | None:
        """Where the queue lives, if it was placed."""
        return self.homes.get((vhost, name))

    def place(self, vhost: str, name: str) -> tuple[int, str | None]:
        """The queue's home, and the record to append durably if it was placed just now."""
        known = self.homes.get((vhost, name))
        if known is not None:
            return known, None
        home = proposed_home(vhost, name, self.workers)
        self.homes[(vhost, name)] = home
        return home, json.dumps({"place": [vhost, name], "worker": home}) + "\n"

    def forget(self, vhost: str, name: str) -> str | None:
        """The queue was deleted: the record to append, if it had a home."""
        if self.homes.pop((vhost, name), None) is None:
            return None
        return json.dumps({"forget": [vhost, name]}) + "\n"

    def stranded(self) -> list[tuple[str, str, int]]:
        """Queues recorded on workers beyond the current number: their logs would be lost."""
        return sorted(
            (vhost, name, home)
            for (vhost, name), home in self.homes.items()
            if home >= self.workers
        )

    def rehome(self) -> list[tuple[str, str, int, int]]:
        """Give every stranded queue the home the hash proposes among the current workers:
        ``(vhost, name, old home, new home)`` for each, by name (``sluicegate placement move``
        moves its log there, docs/operations.md). A jump hash sends each to the worker it would
        have had, had the server always had this many."""
        moves = []
        for vhost, name, home in self.stranded():
            new = proposed_home(vhost, name, self.workers)
            self.homes[(vhost, name)] = new
            moves.append((vhost, name, home, new))
        return moves

    def compacted(self) -> str:
        """One record per queue placed, for rewriting the file without what was forgotten."""
        return "".join(
            json.dumps({"place": [vhost, name], "worker": home}) + "\n"
            for (vhost, name), home in sorted(self.homes.items())
        )

    @classmethod
    def replay(cls, text: str, workers: int) -> Homes:
        """The homes recorded in ``text``; a last line without its newline was torn by a crash
        while it was appended (its queue was never confirmed placed) and is left out."""
        homes = cls(workers)
        homes.read(text)
        return homes

    def read(self, text: str) -> int:
        """Take the records of ``text`` (read on from the last call's end); the length of its
        whole lines, after which a torn line is left out."""
        lines = text.split("\n")
        for number, line in enumerate(lines[:-1], start=1):
            try:
                record = json.loads(line)
                if "place" in record:
                    vhost, name = record["place"]
                    home = record["worker"]
                    if type(home) is not int or home < 0:
                        raise HomesDamaged(f"line {number}: worker {home!r}")
                    self.homes[(str(vhost), str(name))] = home
                else:
                    vhost, name = record["forget"]
                    self.homes.pop((str(vhost), str(name)), None)
            except (ValueError, KeyError, TypeError) as error:
                raise HomesDamaged(f"line {number}: {error}") from error
        return len(text) - len(lines[-1])
