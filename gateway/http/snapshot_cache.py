"""Snapshots by key, each taken at most once per interval and shared by every viewer.

A console left open asks for the same page every few seconds, and a hundred of them ask the
same; the reactor must not read a connection's loops a hundred times for that. A key's snapshot
younger than the interval is answered as it is; an older one is taken again, once, by the
first asker, and the others await that fetch. At most ``capacity`` keys are kept (the least
recently asked is forgotten), so clients asking for ever new keys (pages, connection names)
cannot grow it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Entry(Generic[T]):
    # Until when the value may be answered as it is (monotonic seconds; -inf: no value yet).
    fresh_until: float = float("-inf")
    # The last value, in a tuple: a fetch's value may itself be None.
    held: tuple[T] | None = None
    pending: asyncio.Future[T] | None = None


class SnapshotCache(Generic[T]):
    """At most one fetch per key per ``interval``; at most ``capacity`` keys remembered."""

    def __init__(self, interval: float, capacity: int) -> None:
        self._interval = interval
        self._capacity = capacity
        self._entries: OrderedDict[Hashable, _Entry[T]] = OrderedDict()
        # Fetches started, for tests and docs/console.md.
        self.fetches = 0

    async def get(self, key: Hashable, fetch: Callable[[], Awaitable[T]]) -> T:
        """The key's snapshot: the recent one, the one being taken, or a new one."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            if entry.pending is not None:
                # Shielded: one asker's timeout or disconnection must not cancel the others'.
                return await asyncio.shield(entry.pending)
            if entry.held is not None and time.monotonic() < entry.fresh_until:
                return entry.held[0]
        else:
            entry = self._entries[key] = _Entry()
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        self.fetches += 1
        pending = entry.pending = asyncio.ensure_future(self._fetch(entry, fetch))
        return await asyncio.shield(pending)

    async def _fetch(self, entry: _Entry[T], fetch: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await fetch()
            entry.held = (value,)
            entry.fresh_until = time.monotonic() + self._interval
            return value
        finally:
            entry.pending = None
