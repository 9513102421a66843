"""The HTTP API lists a connection only once it has been open a while, as RabbitMQ's does
(docs/http-api.md): RabbitMQ's clients' test suites "delete all connections" and rely on the
ones they have just opened being spared. Real proton clients, real HTTP (urllib)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from integration.conftest import RunningServer, start_server
from integration.test_http_api import call
from proton import Message
from proton.utils import BlockingConnection
from support.polling import wait_until

DELAY = 1.0


@pytest.fixture(scope="module")
def delayed() -> Iterator[RunningServer]:
    """A RabbitMQ-compatible server (the default) listing connections after ``DELAY``."""
    running = start_server(http_connection_listing_delay=DELAY)
    yield running
    running.stop()


def _listed(running: RunningServer, container: str) -> list[dict[str, Any]]:
    connections: list[dict[str, Any]] = call(running, "GET", "/connections")[1]
    return [c for c in connections if c["container_id"] == container]


def _drop_all(running: RunningServer) -> None:
    """RabbitMQ's Python suite's ``delete_all_connections``: list, then delete each by name."""
    for connection in call(running, "GET", "/connections")[1]:
        call(running, "DELETE", f"/connections/{quote(connection['name'], safe='')}")


def test_a_connection_is_listed_after_the_delay(delayed: RunningServer) -> None:
    opened = time.monotonic()
    connection = BlockingConnection(delayed.url, container_id="l-fresh")
    try:
        assert _listed(delayed, "l-fresh") == []
        assert call(delayed, "GET", "/overview")[1]["object_totals"]["connections"] == 0
        assert call(delayed, "GET", "/vhosts/%2F/connections")[1] == []
        wait_until(lambda: _listed(delayed, "l-fresh") != [], timeout=10 * DELAY)
        assert time.monotonic() - opened >= DELAY
        name = quote(_listed(delayed, "l-fresh")[0]["name"], safe="")
        assert call(delayed, "GET", f"/connections/{name}")[0] == 200
        assert call(delayed, "DELETE", f"/connections/{name}")[0] == 204
        wait_until(lambda: _listed(delayed, "l-fresh") == [])
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def test_dropping_all_connections_spares_a_fresh_one(delayed: RunningServer) -> None:
    """The Python suite's OAuth 2 refresh test: its connection, a second old, survives."""
    old = BlockingConnection(delayed.url, container_id="l-old")
    wait_until(lambda: _listed(delayed, "l-old") != [], timeout=10 * DELAY)
    fresh = BlockingConnection(delayed.url, container_id="l-new")
    try:
        _drop_all(delayed)
        wait_until(lambda: _listed(delayed, "l-old") == [])
        sender = fresh.create_sender("/queues/l-spared")
        sender.send(Message(body="still open"))
        sender.close()  # type: ignore[no-untyped-call]
    finally:
        fresh.close()
        with contextlib.suppress(Exception):
            old.close()


def test_without_rabbitmq_compatibility_a_connection_is_listed_at_once() -> None:
    running = start_server(http_connection_listing_delay=DELAY, rabbitmq_compatible=False)
    connection = BlockingConnection(running.url, container_id="l-plain")
    try:
        assert len(_listed(running, "l-plain")) == 1
    finally:
        connection.close()
        running.stop()
