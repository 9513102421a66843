"""An epoll selector for proton's reactor, without select()'s limit of 1,024 descriptors.

Proton's ``IO.Selector`` calls ``select.select`` (``FD_SETSIZE``: a descriptor above 1,023 raises
``ValueError``) and rescans every selectable's deadline on each update, O(n) per event. This
class has the same interface (``add``, ``remove``, ``update``, ``selectables``, ``select``), so
the reactor's ``IOHandler`` uses it unchanged: interest sets live in the kernel and deadlines in
a heap whose stale entries are skipped when they surface. A connection's deadline moves with
every frame it sends, so stale entries pile up faster than they surface (an idle timeout later):
once they outnumber the live ones the heap is rebuilt from the live deadlines, which keeps it
O(selectables) for O(1) amortised per update. Entries name their selectable by a number, so a
closed connection is not kept alive by its stale entries.

epoll reports a hang-up or error even for a descriptor registered with no interest, and level
triggered it would do so on every wait; so a selectable that wants neither reading nor writing
(a connection whose reads are paused, say) is watched edge triggered for its peer's leaving
alone. Its peer's FIN or RST is reported once, by :meth:`EpollSelector.left`: a connection held
unread would otherwise keep all it holds for as long as the hold lasts, after its client left.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import select
import time
from typing import Final

from sluicegate.gateway.proton.internals import Selectable

# epoll_wait's batch: events beyond it are returned by the next wait, so it bounds only memory.
_MAX_EVENTS: Final = 4096
# Stale heap entries tolerated beyond twice the live deadlines before the heap is rebuilt.
_HEAP_SLACK: Final = 64
_ERROR_EVENTS: Final = select.EPOLLERR | select.EPOLLHUP
# What a selectable that wants neither reading nor writing is watched for: its peer leaving
# (EPOLLRDHUP, and the hang-up and error epoll always reports), once.
_LEAVING: Final = select.EPOLLRDHUP | select.EPOLLET


class EpollSelector:
    """Proton's ``IO.Selector`` interface over ``select.epoll``."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._selectables: set[Selectable] = set()
        # The descriptor each selectable was registered with: a closed socket's fileno() is -1.
        self._fds: dict[Selectable, int] = {}
        self._masks: dict[int, int] = {}
        self._by_fd: dict[int, Selectable] = {}
        # Each live deadline and its heap entry's number; the numbers' owners. Heap entries hold
        # numbers, not selectables, so a stale entry keeps no closed connection alive.
        self._deadlines: dict[Selectable, tuple[float, int]] = {}
        self._owners: dict[int, Selectable] = {}
        self._heap: list[tuple[float, int]] = []
        self._order = itertools.count()
        # Selectables not read whose peer has left since, until the handler takes them.
        self._left: set[Selectable] = set()

    def add(self, selectable: Selectable) -> None:
        """Start watching a new selectable."""
        self._selectables.add(selectable)
        self.update(selectable)

    def remove(self, selectable: Selectable) -> None:
        """Stop watching; called before the reactor closes the descriptor."""
        self._selectables.discard(selectable)
        self._left.discard(selectable)
        self._drop_deadline(selectable)
        fd = self._fds.pop(selectable, None)
        if fd is not None and self._by_fd.get(fd) is selectable:
            del self._by_fd[fd]
            if self._masks.pop(fd, 0):
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)

    def update(self, selectable: Selectable) -> None:
        """Apply a selectable's current reading, writing and deadline."""
        if selectable not in self._selectables:
            return
        fd = self._fds.get(selectable)
        if fd is None:
            fd = selectable.fileno()
            if fd >= 0:
                self._forget(fd)
                self._fds[selectable] = fd
                self._by_fd[fd] = selectable
        if fd >= 0:
            self._watch(fd, selectable)
        deadline = selectable.deadline
        if not deadline:
            self._drop_deadline(selectable)
            return
        current = self._deadlines.get(selectable)
        if current is not None:
            if current[0] == deadline:
                return
            del self._owners[current[1]]
        order = next(self._order)
        self._deadlines[selectable] = (deadline, order)
        self._owners[order] = selectable
        heap = self._heap
        heapq.heappush(heap, (deadline, order))
        if len(heap) > 2 * len(self._owners) + _HEAP_SLACK:
            # Rebuild from the live deadlines once stale entries outnumber them.
            self._heap = list(self._deadlines.values())
            heapq.heapify(self._heap)

    def _drop_deadline(self, selectable: Selectable) -> None:
        current = self._deadlines.pop(selectable, None)
        if current is not None:
            del self._owners[current[1]]

    def _forget(self, fd: int) -> None:
        """Drop a stale owner of ``fd``: its socket was closed and the number reused."""
        stale = self._by_fd.pop(fd, None)
        if stale is not None:
            self._fds.pop(stale, None)
        if self._masks.pop(fd, 0):
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def _watch(self, fd: int, selectable: Selectable) -> None:
        mask = (select.EPOLLIN if selectable.reading else 0) | (
            select.EPOLLOUT if selectable.writing else 0
        )
        if not mask:
            mask = _LEAVING
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if not old:
            self._masks[fd] = mask
            self._epoll.register(fd, mask)
        else:
            self._masks[fd] = mask
            self._epoll.modify(fd, mask)

    def _next_deadline(self) -> float | None:
        heap = self._heap
        owners = self._owners
        while heap:
            deadline, order = heap[0]
            if order in owners:
                return deadline
            heapq.heappop(heap)
        return None

    def select(
        self, timeout: float | None
    ) -> tuple[list[Selectable], list[Selectable], list[Selectable]]:
        """Wait for readiness or the next deadline: (readable, writable, expired)."""
        deadline = self._next_deadline()
        wait = -1.0 if timeout is None else timeout
        if deadline is not None:
            until = max(0.0, deadline - time.time())
            wait = until if wait < 0 else min(wait, until)
        try:
            events = self._epoll.poll(wait, _MAX_EVENTS)
        except InterruptedError:
            events = []
        readable: list[Selectable] = []
        writable: list[Selectable] = []
        by_fd = self._by_fd
        for fd, mask in events:
            selectable = by_fd.get(fd)
            if selectable is None:
                continue
            wanted = self._masks.get(fd, 0)
            if wanted == _LEAVING:
                # Its peer left: the handler is told as for a readable socket, through left().
                self._left.add(selectable)
                readable.append(selectable)
                continue
            if mask & (select.EPOLLIN | _ERROR_EVENTS) and wanted & select.EPOLLIN:
                readable.append(selectable)
            if mask & (select.EPOLLOUT | _ERROR_EVENTS) and wanted & select.EPOLLOUT:
                writable.append(selectable)
        return readable, writable, self._expired(time.time())

    def left(self, selectable: Selectable) -> bool:
        """Whether ``selectable`` is reported readable because its peer left while it was not
        read (once)."""
        if selectable in self._left:
            self._left.discard(selectable)
            return True
        return False

    def _expired(self, now: float) -> list[Selectable]:
        expired: list[Selectable] = []
        heap = self._heap
        owners = self._owners
        while heap and heap[0][0] < now:
            _, order = heapq.heappop(heap)
            selectable = owners.pop(order, None)
            if selectable is not None:
                del self._deadlines[selectable]
                expired.append(selectable)
        return expired

    def close(self) -> None:
        """Release the epoll descriptor."""
        self._epoll.close()
