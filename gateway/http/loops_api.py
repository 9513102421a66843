"""sluicegate's own HTTP API routes, under ``/api/sluicegate/``: the flow-control loops.

RabbitMQ's HTTP API has nothing for them; the console (docs/console.md) reads them from here,
so anything it shows is scriptable. Each kind of snapshot (a connection's page of links, the
budget's holders) is read on the reactor at most once per :data:`SNAPSHOT_INTERVAL` whoever asks
(gateway/http/snapshot_cache.py), as a job of the API's :class:`ReactorCalls`; what a user may
see of it is filtered here, on the HTTP thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.loop_views import budget_holders, connection_loops, visible
from sluicegate.gateway.http.reactor_calls import ReactorCalls
from sluicegate.gateway.http.snapshot_cache import SnapshotCache
from sluicegate.gateway.rules.auth import User

# Seconds a snapshot is answered as it is: the console refreshes every two seconds, so two
# viewers share one and a script polling in a loop costs the reactor one read a second.
SNAPSHOT_INTERVAL: Final = 1.0
# Snapshots remembered (connections' pages and the budget): more than the pages people look at
# at once, few enough that clients asking for ever new names cannot grow the cache. A full page
# (100 consumers, 100 publishers, 128 sessions) is some 230 KiB: at most about 4 MiB in all.
SNAPSHOTS_KEPT: Final = 16
# The largest page number asked for: beyond any connection's links (64 sessions of 256).
MAX_PAGE: Final = 10_000


class ApiError(Exception):
    """A request answered with an HTTP error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class LoopsApi:
    """``GET /api/sluicegate/budget`` and ``GET /api/sluicegate/connections/{name}``."""

    def __init__(self, broker: Broker, calls: ReactorCalls, timeout: float) -> None:
        self._broker = broker
        self._calls = calls
        self._timeout = timeout
        self._snapshots: SnapshotCache[dict[str, object] | None] = SnapshotCache(
            SNAPSHOT_INTERVAL, SNAPSHOTS_KEPT
        )

    async def answer(
        self, user: User, method: str, segments: list[str], query: Mapping[str, str]
    ) -> dict[str, object]:
        """The JSON body for ``/api/sluicegate/SEGMENTS``; raises :class:`ApiError`."""
        if segments == ["budget"]:
            _get_only(method)
            return await self._budget(user)
        if len(segments) == 2 and segments[0] == "connections":
            _get_only(method)
            return await self._connection(user, segments[1], _page(query))
        raise ApiError(404, "Not Found")

    async def _budget(self, user: User) -> dict[str, object]:
        broker = self._broker

        async def fetch() -> dict[str, object] | None:
            return await self._calls.run(budget_holders(broker), self._timeout)

        snapshot = await self._snapshots.get("budget", fetch)
        assert snapshot is not None

        def mine(item: object) -> bool:
            assert isinstance(item, dict)
            vhost = item["vhost"]
            if "connection" in item:
                return user.permissions(vhost) is not None and visible(broker, user, item["user"])
            return user.permissions(vhost) is not None

        return {
            key: [item for item in value if mine(item)] if isinstance(value, list) else value
            for key, value in snapshot.items()
        }

    async def _connection(self, user: User, name: str, page: int) -> dict[str, object]:
        broker = self._broker

        async def fetch() -> dict[str, object] | None:
            return await self._calls.call(
                lambda: connection_loops(broker, name, page), self._timeout
            )

        snapshot = await self._snapshots.get(("connection", name, page), fetch)
        if snapshot is None or not visible(broker, user, str(snapshot["user"])):
            raise ApiError(404, "Not Found")
        return snapshot


def _get_only(method: str) -> None:
    if method != "GET":
        raise ApiError(405, f"method {method} not allowed here")


def _page(query: Mapping[str, str]) -> int:
    text = query.get("page", "1")
    if not (text.isdigit() and len(text) <= len(str(MAX_PAGE)) and 1 <= int(text) <= MAX_PAGE):
        raise ApiError(400, f"page must be 1 to {MAX_PAGE}")
    return int(text)
