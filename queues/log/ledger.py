"""Which segments compaction may delete, from counts kept as records are placed.

A segment may go when (1) every message it enqueued is settled, (2) every older segment whose
messages its settle records name is gone, since otherwise replay would find those messages
without their settlement and bring them back, and (3) when it removes a queue,
exchange or binding, every older segment is gone, since an older one may still declare it.
Segments are deleted oldest first, so one pass in order decides them all. Acquire, return and
delivery-count records pin nothing: a message redelivered many times would otherwise keep a
segment per delivery. Every segment starts with the live messages' counts and acquisitions
(:mod:`queues.log.changes`), so compacting one away loses none of them. Disk use follows the
live backlog: a message that stays unsettled keeps its own segment and those that settle its
neighbours, nothing else.
"""

from __future__ import annotations


class SegmentLedger:
    """Live-message counts and cross-segment references of every segment on disk."""

    def __init__(self) -> None:
        self._live: dict[int, int] = {}
        self._refs: dict[int, set[int]] = {}
        self._removes_topology: set[int] = set()

    def open_segment(self, segment: int) -> None:
        """A new segment exists (it may hold nothing yet)."""
        self._live.setdefault(segment, 0)
        self._refs.setdefault(segment, set())

    def enqueued(self, segment: int) -> None:
        """A message was enqueued in ``segment``."""
        self._live[segment] += 1

    def settled(self, message_segment: int, record_segment: int, count: int = 1) -> None:
        """``count`` messages of ``message_segment`` were settled by a record in
        ``record_segment``."""
        self._live[message_segment] -= count
        if message_segment != record_segment:
            self._refs[record_segment].add(message_segment)

    def topology_removed(self, record_segment: int) -> None:
        """``record_segment`` removes a queue, exchange or binding."""
        self._removes_topology.add(record_segment)

    def live(self, segment: int) -> int:
        """Unsettled messages enqueued in ``segment``."""
        return self._live.get(segment, 0)

    @property
    def segments(self) -> list[int]:
        """The segments on disk, oldest first."""
        return sorted(self._live)

    def collect(self, active: int) -> list[int]:
        """Forget and return the segments that may be deleted; ``active`` is still written."""
        deleted: list[int] = []
        older_remain = False
        for segment in sorted(self._live):
            if segment >= active:
                break
            free = (
                self._live[segment] == 0
                and not (self._refs[segment] & self._live.keys())
                and not (older_remain and segment in self._removes_topology)
            )
            if free:
                del self._live[segment]
                del self._refs[segment]
                self._removes_topology.discard(segment)
                deleted.append(segment)
            else:
                older_remain = True
        return deleted
