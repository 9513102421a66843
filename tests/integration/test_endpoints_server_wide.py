"""Connections, sessions and links, with their ATTACH data, are charged to one account of the
server's (session/endpoint_memory.py, docs/bounds.md): each connection's caps bounded what one
client made the server hold, but not what many did. Past the account's room a connection is
closed with amqp:resource-limit-exceeded and gives everything back; clients within their
allowance keep getting in while others fill the half they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import proton
import pytest
from integration.conftest import RunningServer
from support.clients import consume, publish
from support.frames import Composite
from support.polling import wait_until
from support.prober import ROUND_TIMEOUT, Prober
from support.raw_client import PeerClosedError, RawClient

from sluicegate.session.endpoint_memory import (
    ALLOWANCE,
    CONNECTION_COST,
    EXCESS_SHARE,
    EndpointMemory,
)

KiB: Final = 1024
MiB: Final = 1024 * KiB
LIMIT: Final = 4 * MiB
# Links of 100 KiB of properties, twelve a connection: 1.2 MiB each, within max_attach_data_size
# (8 MiB), so that only the server-wide account refuses them.
BLOB: Final = {"blob": "x" * (100 * KiB)}
LINKS: Final = 12
HOGS: Final = 8
RESOURCE_LIMIT: Final = proton.symbol("amqp:resource-limit-exceeded")


def _endpoints(server: RunningServer) -> EndpointMemory:
    endpoints: EndpointMemory = server.server.broker.endpoints
    return endpoints


def _figures(server: RunningServer) -> tuple[int, int, int, int]:
    """The account's sum, its part beyond allowances, its peak, and what the open connections
    say they hold."""

    def read() -> tuple[int, int, int, int]:
        endpoints = _endpoints(server)
        held = sum(state.endpoint_bytes for state in server.server.broker.connections)
        return endpoints.held, endpoints.beyond, endpoints.peak, held

    figures: tuple[int, int, int, int] = server.call(read)
    return figures


def _hog(server: RunningServer, index: int) -> tuple[RawClient, int, Composite | None]:
    """A connection attaching :data:`LINKS` large links: it, how many were taken, and the
    CLOSE's error if the server closed it."""
    client = RawClient.connect(server.host, server.port, container_id=f"hog-{index}")
    client.begin(0)
    handles = [
        client.attach(f"a{i}", "sender", target="/queues/endpoints", properties=BLOB)
        for i in range(LINKS)
    ]
    taken = 0
    try:
        for handle in handles:
            assert client.wait_attach(handle).error is None
            taken += 1
    except PeerClosedError as closed:
        return client, taken, closed.frame["error"]
    return client, taken, None


def test_many_connections_attaching_large_links_fill_only_the_half_they_share(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(max_endpoints_size=LIMIT)
    hogs: list[RawClient] = []
    with Prober(server.url, "/queues/endpoints-probe") as prober:
        prober.wait_rounds(1, timeout=30)
        try:
            answers = []
            for index in range(HOGS):
                client, taken, error = _hog(server, index)
                hogs.append(client)
                answers.append((taken, error))
            # 9.6 MiB of links asked for: the first connection took its twelve; each after it
            # took what the shared half had left and was closed at the next, giving it all back
            # at once for the next to take.
            assert answers[0] == (LINKS, None)
            left = answers[1][0]
            assert 0 < left < LINKS
            for taken, error in answers[1:]:
                assert taken == left
                assert error is not None
                assert error["condition"] == RESOURCE_LIMIT
                assert "max_endpoints_size" in error["description"]
            held, beyond, peak, connections = _figures(server)
            assert beyond <= LIMIT // EXCESS_SHARE
            assert peak <= LIMIT
            assert held == connections
            # A new client within its allowance gets in, publishes and consumes meanwhile.
            assert publish(server.url, "/queues/endpoints-new", [b"new"]).outcomes == ["accepted"]
            assert consume(server.url, "/queues/endpoints-new", 1).bodies == [b"new"]
        finally:
            for client in hogs:
                client.abort()
        # Every closed connection gave everything back at once: what is left is the prober's.
        wait_until(lambda: _figures(server)[3] == _figures(server)[0] < ALLOWANCE)
        assert _figures(server)[1] == 0
    seen = prober.seen
    assert seen.failures == []
    assert seen.worst < ROUND_TIMEOUT


def test_at_the_limit_a_connection_is_refused_at_open_until_one_leaves(
    make_server: Callable[..., RunningServer],
) -> None:
    limit = 10 * CONNECTION_COST
    server = make_server(max_endpoints_size=limit)
    clients = [RawClient.connect(server.host, server.port, container_id=f"c{i}") for i in range(10)]
    try:
        assert _figures(server)[0] == limit
        with RawClient.connect(server.host, server.port, container_id="one-more") as refused:
            close = refused.wait_for("close")
            # Its socket is closed with no answer from it: a refused client held nothing
            # for as long as it sent heartbeats.
            assert refused.socket_closed()
        assert close["error"]["condition"] == RESOURCE_LIMIT
        assert "max_endpoints_size" in close["error"]["description"]
        # A session is refused the same way: its connection closed, nothing of it kept.
        with pytest.raises(PeerClosedError) as closed:
            clients[0].begin(0)
        assert closed.value.frame["error"]["condition"] == RESOURCE_LIMIT
        assert "no room for this session" in closed.value.frame["error"]["description"]
        clients[1].abort()
        wait_until(lambda: _figures(server)[0] == 8 * CONNECTION_COST)
        with RawClient.connect(server.host, server.port, container_id="after") as admitted:
            admitted.begin(0)
            with pytest.raises(TimeoutError):
                admitted.wait_for("close", timeout=0.5)
    finally:
        for client in clients:
            client.abort()
    wait_until(lambda: _figures(server)[0] == 0)
