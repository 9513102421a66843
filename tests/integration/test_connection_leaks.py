"""Nothing of a closed connection stays in the server (issue 16, "Nothing leaks").

Each connection here publishes, consumes (keeping a delivery unsettled), leaves a multi-frame
delivery unfinished and talks to the management node, so that every kind of per-connection
record exists when it ends. It then ends in one of the three ways a connection ends: the client
closes it, the client drops its socket, or the server closes it for an error. Afterwards no
object the gateway made for it may be alive: weak references taken while it was open must all
be dead once the server is done with it.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Final

import proton
import pytest
from integration.conftest import RunningServer
from support.clients import consume, publish
from support.frames import FRAME_HEADER
from support.polling import wait_until
from support.process import serving
from support.raw_client import RawClient

# A frame proton cannot decode: the server closes the connection with amqp:decode-error.
UNDECODABLE: Final = FRAME_HEADER.pack(16, 2, 0, 0) + b"\xff" * 8
ENDINGS: Final = ("close", "drop", "error")


def _payload(body: str) -> bytes:
    encoded: bytes = proton.Message(body=body).encode()
    return encoded


def _busy_connection(server: RunningServer, queue: str, name: str) -> RawClient:
    """A connection holding one of everything: see the module docstring."""
    client = RawClient.connect(server.host, server.port, container_id=name, max_frame_size=4096)
    client.begin()
    publisher = client.attach("publisher", "sender", target=f"/queues/{queue}")
    client.wait_credit(publisher)
    sent = client.send(publisher, _payload("kept"))
    client.wait_outcomes([sent])
    consumer = client.attach("consumer", "receiver", source=f"/queues/{queue}")
    client.wait_attach(consumer)
    client.flow(consumer, link_credit=10)
    assert client.next_message() is not None  # left unsettled
    partial = client.attach("partial", "sender", target=f"/queues/{queue}-partial")
    client.wait_credit(partial)
    # The first frames of a delivery that never finishes.
    big = _payload("x" * 20_000)
    client.send(partial, big)
    management = client.attach("m", "sender", target="/management")
    client.attach("m", "receiver", source="/management")
    client.wait_attach(management)
    return client


def _records_of(server: RunningServer, name: str) -> list[weakref.ref[object]]:
    """Weak references to everything the gateway keeps for the connection named ``name``."""

    def collect() -> list[weakref.ref[object]]:
        states = [
            state
            for state in server.server.broker.connections
            if state.connection.remote_container == name
        ]
        assert len(states) == 1
        state = states[0]
        objects: list[object] = [state, state.writer, state.account]
        for session in state.sessions.values():
            objects += [session, session.pure, *session.senders.values()]
            objects += [link.link for link in session.senders.values()]
            objects += list(session.management_pairs.values())
        for publisher in state.publishers:
            objects += [publisher, publisher.link]
        return [weakref.ref(o) for o in objects]

    return server.call(collect)


def _alive(server: RunningServer, refs: list[weakref.ref[object]]) -> list[str]:
    def check() -> list[str]:
        gc.collect()
        return [type(o).__name__ for ref in refs if (o := ref()) is not None]

    return server.call(check)


def _end(client: RawClient, ending: str) -> None:
    if ending == "close":
        client.close()
    elif ending == "drop":
        client.abort()
    else:
        client.send_raw(UNDECODABLE)
        close = client.wait_for("close")
        assert close["error"]["condition"] == "amqp:decode-error"
        client.abort()


@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_of_a_closed_connection_survives(
    make_server: Callable[..., RunningServer], ending: str
) -> None:
    server = make_server()
    name = f"leak-{ending}"
    client = _busy_connection(server, f"leak-{ending}", name)
    refs = _records_of(server, name)
    assert len(refs) >= 10
    _end(client, ending)
    wait_until(lambda: server.call(lambda: len(server.server.broker.connections)) == 0)
    wait_until(lambda: not _alive(server, refs), timeout=10)
    # The unsettled delivery went back to its queue; the server serves the next client.
    assert publish(server.url, f"/queues/leak-{ending}", ["after"]).outcomes == ["accepted"]
    assert consume(server.url, f"/queues/leak-{ending}", 2).bodies == ["kept", "after"]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _cycle(port: int, index: int) -> None:
    """Open, publish, consume, and end in the ``index``-th of the three ways."""
    client = RawClient.connect("127.0.0.1", port, max_frame_size=4096)
    client.begin()
    queue = f"/queues/rss-{index % 10}"
    publisher = client.attach("p", "sender", target=queue)
    client.wait_credit(publisher)
    client.wait_outcomes([client.send(publisher, _payload("m"))])
    consumer = client.attach("c", "receiver", source=queue)
    client.flow(consumer, link_credit=1)
    delivery = client.next_message()
    assert delivery is not None
    if index % 2:
        client.disposition(delivery.delivery_id)
    _end(client, ENDINGS[index % 3])


@pytest.mark.slow
def test_a_thousand_connections_cost_no_lasting_memory() -> None:
    """RSS after 1,000 more connections has grown by at most 2 KB per connection."""
    connections = 1000
    with serving("--metrics-listen", "off") as (process, port):
        # Warm up: the allocator's arenas, proton's pools and Python's caches reach their size.
        for index in range(300):
            _cycle(port, index)
        time.sleep(1.0)
        before = _rss_kib(process.pid)
        for index in range(connections):
            _cycle(port, index)
        time.sleep(1.0)
        growth = _rss_kib(process.pid) - before
    assert growth <= 2 * connections, f"RSS grew {growth} KiB over {connections} connections"
