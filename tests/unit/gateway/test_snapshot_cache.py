"""The console's snapshot cache: one fetch per key per interval shared by every asker, and a
bounded number of keys whatever keys clients ask for."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.gateway.http.snapshot_cache import SnapshotCache


class _Source:
    """Counts fetches; each answers its number after a pause, so askers overlap it."""

    def __init__(self) -> None:
        self.fetches = 0

    async def fetch(self) -> int:
        self.fetches += 1
        number = self.fetches
        await asyncio.sleep(0.01)
        return number


def test_askers_during_a_fetch_and_within_the_interval_share_one() -> None:
    async def scenario() -> None:
        cache: SnapshotCache[int] = SnapshotCache(interval=60.0, capacity=4)
        source = _Source()
        answers = await asyncio.gather(*(cache.get("k", source.fetch) for _ in range(100)))
        assert answers == [1] * 100
        assert await cache.get("k", source.fetch) == 1
        assert source.fetches == cache.fetches == 1

    asyncio.run(scenario())


def test_an_older_snapshot_is_taken_again() -> None:
    async def scenario() -> None:
        cache: SnapshotCache[int] = SnapshotCache(interval=0.0, capacity=4)
        source = _Source()
        assert [await cache.get("k", source.fetch) for _ in range(3)] == [1, 2, 3]

    asyncio.run(scenario())


def test_none_is_a_snapshot_too() -> None:
    """A connection that is gone answers None: remembered like any answer, not fetched again."""

    async def scenario() -> None:
        cache: SnapshotCache[int | None] = SnapshotCache(interval=60.0, capacity=4)
        calls = 0

        async def gone() -> int | None:
            nonlocal calls
            calls += 1
            return None

        assert await cache.get("gone", gone) is None
        assert await cache.get("gone", gone) is None
        assert calls == 1

    asyncio.run(scenario())


def test_keys_are_capped_the_least_recently_asked_forgotten() -> None:
    async def scenario() -> None:
        cache: SnapshotCache[int] = SnapshotCache(interval=60.0, capacity=2)
        source = _Source()
        # Fifty keys, one fetch of 10 ms each: as many as a thousand would show, in 0.5 s.
        for key in range(50):
            await cache.get(key, source.fetch)
        assert len(cache._entries) == 2
        await cache.get(49, source.fetch)
        assert source.fetches == 50
        await cache.get(0, source.fetch)
        assert source.fetches == 51

    asyncio.run(scenario())


def test_a_failed_fetch_is_not_remembered() -> None:
    async def scenario() -> None:
        cache: SnapshotCache[int] = SnapshotCache(interval=60.0, capacity=2)
        failures = 0

        async def failing() -> int:
            nonlocal failures
            failures += 1
            raise TimeoutError

        for _ in range(2):
            with pytest.raises(TimeoutError):
                await cache.get("k", failing)
        assert failures == 2
        source = _Source()
        assert await cache.get("k", source.fetch) == 1

    asyncio.run(scenario())
