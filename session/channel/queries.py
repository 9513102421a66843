"""Management's questions to the worker that owns a queue (docs/workers.md): its counts, a
purge, its deletion, a declaration for it to judge.

A worker holds a stand-in (:class:`~.remote.RemoteQueue`) for every queue another worker owns;
management on it reads the owner's figures with a :class:`~.frames.Query` and its
:class:`~.frames.Answer`. :class:`Questions` keeps a channel's questions out: a count asked while
the same one is out joins it, so a channel carries at most one COUNTS and one STAT per queue and
:data:`MAX_PURGES` purges, deletions and declarations, whatever management is asked.
:class:`Figures` is one request's questions: the request is answered once they are
(gateway/management/node.py), by routing it again, when every stand-in it reads finds its
answer there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import astuple
from typing import Final

from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.session.channel.codec import ChannelError
from sluicegate.session.channel.frames import ANSWER_COUNTS, Answer, Query, QueryOp

# Purges, deletions and declarations out on one channel at once: each is its own question (a
# purge drops what reached the owner before it, so two are never one; a second deletion finds
# nothing, 0, as on one worker; each declaration is judged), and each waits on a management
# request, of which a connection has 8 at most (gateway/management/node.py); past this many,
# refused at once.
MAX_PURGES: Final = 64
# The questions that change the queue: never joined, counted against MAX_PURGES.
_CHANGES: Final = frozenset(
    {QueryOp.PURGE, QueryOp.DELETE, QueryOp.DECLARE, QueryOp.DECLARE_EXCHANGE}
)
# The stream offsets among the counts, sent as -1 when absent.
_OFFSETS: Final = 3
_ABSENT: Final = -1


class Asked:
    """One question's outcome, shared by every request that asked it while it was out."""

    __slots__ = ("answer", "error", "missing")

    def __init__(self, error: str | None = None) -> None:
        self.answer: Answer | None = None
        # Why it will never be answered: the owner is not serving, or it has no such queue
        # (``missing``).
        self.error = error
        self.missing = False

    @property
    def done(self) -> bool:
        return self.answer is not None or self.error is not None


class Questions:
    """A channel's questions out, by the id the owner answers."""

    __slots__ = ("_joined", "_out", "next_id", "purges")

    def __init__(self) -> None:
        self.next_id = 1
        self._out: dict[int, tuple[tuple[QueryOp, str, str], Asked]] = {}
        # The count of each queue out now, by what it asks: a later asker joins it.
        self._joined: dict[tuple[QueryOp, str, str], Asked] = {}
        self.purges = 0

    def ask(
        self, op: QueryOp, vhost: str, queue: str, declaration: bytes = b""
    ) -> tuple[Asked, Query | None]:
        """The outcome to wait for, and the query to send (None: joined one out, or refused)."""
        key = (op, vhost, queue)
        if op not in _CHANGES:
            joined = self._joined.get(key)
            if joined is not None:
                return joined, None
        elif self.purges >= MAX_PURGES:
            out = f"{MAX_PURGES} purges, deletions and declarations"
            return Asked(f"{out} are out to the queue's worker already"), None
        asked = Asked()
        query = self.next_id
        self.next_id += 1
        self._out[query] = (key, asked)
        if op in _CHANGES:
            self.purges += 1
        else:
            self._joined[key] = asked
        return asked, Query(query, op, vhost, queue, declaration)

    def answered(self, answer: Answer) -> Asked:
        """The question ``answer`` answers, now done; an answer nobody asked for ends the
        channel."""
        out = self._out.pop(answer.query, None)
        if out is None:
            raise ChannelError(f"an answer to query {answer.query}, which is not out")
        key, asked = out
        if key[0] in _CHANGES:
            self.purges -= 1
        else:
            del self._joined[key]
        if answer.found:
            asked.answer = answer
        else:
            asked.error = f"no queue '{key[2]}' in vhost '{key[1]}'"
            asked.missing = True
        return asked

    def lost(self, reason: str) -> list[Asked]:
        """The channel ended: every question out fails with ``reason``."""
        failed = [asked for _, asked in self._out.values()]
        for asked in failed:
            asked.error = reason
        self._out.clear()
        self._joined.clear()
        self.purges = 0
        return failed

    def __len__(self) -> int:
        return len(self._out)


class Figures:
    """One management request's questions to owners, by stand-in and what it needs of it
    (``"counts"``, ``"purge"``, ``"delete"``, ``"declare"`` or ``"declare-exchange"``): asked
    on one run, read on the next."""

    __slots__ = ("asked",)

    def __init__(self) -> None:
        self.asked: dict[tuple[str, str, str], Asked] = {}

    def deleted(self, vhost: str, queue: str) -> int | None:
        """How many ready messages the owner deleted with the queue, once it answered (0: it
        had no such queue any more); None if the request did not ask, or is still waiting.

        Read without the stand-in: the owner's deletion reaches this worker before its answer
        (gateway/peers.py), and takes the stand-in with it."""
        asked = self.asked.get((vhost, queue, "delete"))
        if asked is None or not asked.done:
            return None
        return 0 if asked.answer is None else asked.answer.purged

    @property
    def pending(self) -> bool:
        return any(not asked.done for asked in self.asked.values())

    @property
    def failure(self) -> Asked | None:
        """A question that failed, if any: the request cannot be answered with the owners'
        figures. A queue its owner no longer has is no failure: its deletion is on its way
        here, and the stand-in reads zeros until then."""
        return next((a for a in self.asked.values() if a.error and not a.missing), None)


class Reads:
    """The request whose figures the stand-ins read now: one at a time, on the reactor's
    thread; None outside a management request (a stand-in then reads zeros, as metrics do)."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: Figures | None = None

    @contextlib.contextmanager
    def using(self, figures: Figures | None) -> Iterator[None]:
        """Read into ``figures`` for the block (a block inside another keeps the outer's)."""
        if figures is None or self.current is not None:
            yield
            return
        self.current = figures
        try:
            yield
        finally:
            self.current = None


def counts_of(statistics: QueueStatistics) -> tuple[int, ...]:
    """A queue's counts as an :class:`~.frames.Answer` carries them."""
    values = astuple(statistics)[1:]
    head = values[:-_OFFSETS]
    offsets = tuple(_ABSENT if value is None else value for value in values[-_OFFSETS:])
    return (*head, *offsets)


def statistics_of(name: str, counts: tuple[int, ...]) -> QueueStatistics:
    """The counts an :class:`~.frames.Answer` carries, as the queue's statistics."""
    assert len(counts) == ANSWER_COUNTS
    head = counts[:-_OFFSETS]
    offsets = tuple(None if value == _ABSENT else value for value in counts[-_OFFSETS:])
    return QueueStatistics(name, *head, *offsets)


def no_counts(name: str) -> QueueStatistics:
    """What a stand-in reports outside a request: zeros, so that one scrape adds up."""
    return QueueStatistics(name, 0, 0, 0, 0, 0, 0, 0)
