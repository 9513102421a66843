"""A publisher the memory budget holds unread is still heard when it leaves politely (issue 31).

The server stops reading a held publisher's socket (docs/inbound-flow-control.md), so a CLOSE,
END or DETACH it sent waited with everything it held for the hold to lift, which may be never
when nobody consumes. While held the server reads a few KiB more (``HELD_READ``) and acts only
on the frames that free things; what a held client sends beyond that stays in TCP's buffers.
Every wait below is for something that never comes without that, while the budget stays full.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

import proton
import pytest
from integration.conftest import RunningServer, Scheme
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.state import ConnectionState
from sluicegate.wire.held_frames import HELD_READ, TLS_RECORD

KiB: Final = 1024
MiB: Final = 1024 * KiB
BUDGET: Final = 2 * MiB
# Within one TLS record and one read: the read that exhausts the budget ends with a message,
# and the hold never falls in the middle of one (that message would wait for the hold).
BODY: Final[bytes] = proton.Message(body=b"h" * (12 * KiB)).encode()
FLOOD: Final[bytes] = proton.Message(body=b"f" * (16 * KiB)).encode()
SMALL: Final[bytes] = proton.Message(body=b"small").encode()


def _connection(server: RunningServer, name: str) -> ConnectionState | None:
    for state in server.server.broker.connections:
        assert isinstance(state, ConnectionState)
        if state.connection.remote_container == name:
            return state
    return None


def _held(server: RunningServer, name: str) -> bool:
    def held() -> bool:
        state = _connection(server, name)
        return state is not None and state.reads_paused

    return bool(server.call(held))


def _blocked(server: RunningServer) -> bool:
    return bool(server.call(lambda: server.server.broker.publishing.budget.blocked))


def _depth(server: RunningServer, queue: str) -> int:
    def depth() -> int:
        found = server.server.tenancy.vhosts["/"].registry.get(queue)
        return -1 if found is None else found.statistics().ready

    return int(server.call(depth))


def _held_publisher(server: RunningServer, name: str, scheme: Scheme) -> tuple[RawClient, int]:
    """A raw publisher to a queue nobody consumes, confirmed message by message until the
    budget holds it with credit left: nothing it sent is unread."""
    client = RawClient.connect(server.host, scheme.port(server), container_id=name, tls=scheme.tls)
    client.begin()
    handle = client.attach("held", "sender", target=f"/queues/{name}")
    client.wait_credit(handle)
    for _ in range(4 * BUDGET // len(BODY)):
        delivery = client.send(handle, BODY)
        client.wait_outcomes([delivery], timeout=10)
        if not _blocked(server):
            continue
        # The hold is decided at the end of the reactor's batch that exhausted the budget.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if _held(server, name):
                assert client.links[handle].link_credit > 0
                return client, handle
            time.sleep(0.02)
    client.abort()
    raise AssertionError("the budget never held the publisher")


@pytest.fixture
def server(make_server: Callable[..., RunningServer], scheme: Scheme) -> RunningServer:
    return make_server(memory_budget=BUDGET, **scheme.settings)


def test_a_held_publishers_close_is_answered_and_frees_it(
    server: RunningServer, scheme: Scheme
) -> None:
    client, _ = _held_publisher(server, "leaves", scheme)
    with client:
        close = client.close(timeout=10)
    assert close is not None
    assert close["error"] is None
    wait_until(lambda: server.call(lambda: _connection(server, "leaves")) is None, timeout=10)
    assert _blocked(server)


def test_a_held_publishers_detach_and_end_are_answered(
    server: RunningServer, scheme: Scheme
) -> None:
    client, handle = _held_publisher(server, "detaches", scheme)
    with client:
        client.detach(handle)
        assert client.wait_for("detach", timeout=10)["error"] is None
        client.end()
        assert client.wait_for("end", timeout=10)["error"] is None
        assert _blocked(server)


def test_a_close_behind_transfers_the_hold_kept_unread_closes_without_them(
    server: RunningServer, scheme: Scheme
) -> None:
    """The transfers before the CLOSE are never read: they were not settled, and the CLOSE
    says why."""
    client, handle = _held_publisher(server, "hurries", scheme)
    depth = _depth(server, "hurries")
    with client:
        client.send(handle, SMALL)
        close = client.close(timeout=10)
    assert close is not None
    assert close["error"]["condition"] == "amqp:resource-limit-exceeded"
    wait_until(lambda: server.call(lambda: _connection(server, "hurries")) is None, timeout=10)
    assert _depth(server, "hurries") == depth
    assert _blocked(server)


def test_a_held_flood_of_transfers_stays_held_and_unread(
    server: RunningServer, scheme: Scheme
) -> None:
    """However much a held client sends, the server reads at most ``HELD_READ`` of it (through
    TLS, plus the rest of the record it began)."""
    client, handle = _held_publisher(server, "floods", scheme)
    depth = _depth(server, "floods")
    sent = 0

    def flood() -> None:
        nonlocal sent
        client.write_timeout = 3.0
        try:
            for _ in range(2000):
                client.send(handle, FLOOD)
                sent += len(FLOOD)
        except (TimeoutError, OSError):
            return

    with client:
        writer = threading.Thread(target=flood)
        writer.start()
        writer.join(timeout=30)
        assert not writer.is_alive()
        assert sent < 2000 * len(FLOOD)  # TCP pushed back
        state = server.call(lambda: _connection(server, "floods"))
        assert state is not None
        assert _held(server, "floods")
        bound = HELD_READ + (0 if scheme.tls is None else TLS_RECORD)
        assert 0 < server.call(lambda: len(state.held.data)) <= bound
        assert _depth(server, "floods") == depth
