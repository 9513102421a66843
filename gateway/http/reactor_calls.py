"""HTTP handlers' work on the reactor thread: awaited, one job at a time, with rests between.

Everything that reads or changes the broker runs on the reactor thread (gateway/server.py).
An HTTP client must not be able to load it however fast it asks: jobs run one at a time, and
after a job the next starts only once as long again has passed (:class:`ReactorCalls`), so
HTTP takes at most half of the reactor's time, whatever the number of requests; a job is
itself bounded (a page of a listing, gateway/rules/management/router.py). Scrapes share snapshots
(:class:`Throttled`): however many scrapers, one snapshot at a time and at most one per
interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import Future
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Submit(Protocol):
    """``Server.submit_in_turns``: start a job on the reactor, its result in a future."""

    def __call__(self, steps: Generator[None, None, T], /) -> Future[T]: ...


class ReactorCalls:
    """Runs jobs on the reactor through ``submit`` (``Server.submit_in_turns``)."""

    def __init__(self, submit: Submit) -> None:
        self._submit = submit
        self._one = asyncio.Lock()
        # When the next job may start: the end of the last plus its duration.
        self._rest_until = 0.0

    async def run(self, steps: Generator[None, None, T], timeout: float) -> T:
        """Run ``steps`` on the reactor and return its result; TimeoutError past ``timeout``."""
        async with asyncio.timeout(timeout), self._one:
            rest = self._rest_until - time.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)
            start = time.monotonic()
            try:
                return await asyncio.wrap_future(self._submit(steps))
            finally:
                end = time.monotonic()
                self._rest_until = end + (end - start)

    async def call(self, function: Callable[[], T], timeout: float) -> T:
        """Run ``function`` on the reactor as a job of one step."""
        return await self.run(_at_once(function), timeout)


def _at_once(function: Callable[[], T]) -> Generator[None, None, T]:
    yield from ()
    return function()


class Throttled(Generic[T]):
    """A value fetched at most once per ``interval``; who asks during a fetch shares it."""

    def __init__(self, fetch: Callable[[], Awaitable[T]], interval: float) -> None:
        self._fetch = fetch
        self._interval = interval
        self._pending: asyncio.Future[T] | None = None
        self._last_end = float("-inf")

    async def get(self) -> T:
        """The next fetch's value (started now, or after the interval since the last)."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fetch_in_turn())
        # Shielded: one asker's timeout or disconnection must not cancel the others' fetch.
        return await asyncio.shield(self._pending)

    async def _fetch_in_turn(self) -> T:
        try:
            wait = self._last_end + self._interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            return await self._fetch()
        finally:
            self._last_end = time.monotonic()
            self._pending = None
