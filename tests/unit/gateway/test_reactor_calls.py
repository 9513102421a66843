"""How HTTP work reaches the reactor: one job at a time with rests, snapshots shared.

The reactor is stood in for by a one-thread executor that runs each job's steps in turn, as
``Server.submit_in_turns`` does on the reactor thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import pytest

from sluicegate.gateway.http.reactor_calls import ReactorCalls, Throttled

T = TypeVar("T")
# The job's length: long enough that its rest is measurable on a loaded machine.
JOB_SECONDS = 0.2


class _Reactor:
    """One thread that runs jobs to completion, counting how many ran at once."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1)
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.spans: list[tuple[float, float]] = []

    def submit(self, steps: Generator[None, None, T]) -> Future[T]:
        return self._thread.submit(self._run, steps)

    def _run(self, steps: Generator[None, None, T]) -> T:
        start = time.monotonic()
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    result: T = done.value
                    return result
        finally:
            with self._lock:
                self.running -= 1
            self.spans.append((start, time.monotonic()))


def _job(value: int) -> Generator[None, None, int]:
    yield
    time.sleep(JOB_SECONDS)
    return value


def test_jobs_run_one_at_a_time_each_followed_by_a_rest_as_long() -> None:
    reactor = _Reactor()

    async def many() -> list[int]:
        calls = ReactorCalls(reactor.submit)
        return await asyncio.gather(*(calls.run(_job(n), timeout=30) for n in range(4)))

    assert asyncio.run(many()) == [0, 1, 2, 3]
    assert reactor.most == 1
    spans = sorted(reactor.spans)
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        # The rest after a job is at least as long as the job took (some margin for the
        # clock's granularity).
        assert next_start - end >= 0.9 * (end - start)


def test_concurrent_askers_share_one_fetch_and_fetches_keep_their_interval() -> None:
    fetched: list[float] = []
    interval = 0.3

    async def fetch() -> int:
        fetched.append(time.monotonic())
        await asyncio.sleep(0.05)
        return len(fetched)

    async def scrapes() -> tuple[list[int], int]:
        throttled = Throttled(fetch, interval)
        together = await asyncio.gather(*(throttled.get() for _ in range(20)))
        after = await throttled.get()
        return together, after

    together, after = asyncio.run(scrapes())
    assert together == [1] * 20
    assert after == 2
    assert len(fetched) == 2
    # The second fetch starts an interval after the first one ended (50 ms after it began).
    assert fetched[1] - fetched[0] >= 0.9 * (interval + 0.05)


def test_a_job_the_reactor_does_not_answer_times_out() -> None:
    never: Future[int] = Future()

    async def stuck() -> None:
        calls = ReactorCalls(lambda steps: never)  # type: ignore[arg-type]
        await calls.run(_job(0), timeout=0.1)

    with pytest.raises(TimeoutError):
        asyncio.run(stuck())
