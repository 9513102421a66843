"""More than 2,000 concurrent connections: the reactor waits in epoll, not select().

select() cannot watch a descriptor above 1,023 (docs/design.md); the server in this process holds
one socket per client and the clients hold the other ends, so 2,100 clients put the server's
descriptors far past that line.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable, Iterator

import pytest
from integration.conftest import RunningServer
from proton import Message
from support.clients import consume
from support.polling import wait_until
from support.raw_client import RawClient

CLIENTS = 2100
# Two descriptors per client in this process (client and server end), plus the test's own.
DESCRIPTORS_NEEDED = 2 * CLIENTS + 512


@pytest.fixture
def enough_descriptors() -> Iterator[None]:
    """Raise this process's soft descriptor limit for the test, as an operator would."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < DESCRIPTORS_NEEDED:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {DESCRIPTORS_NEEDED} needed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, DESCRIPTORS_NEEDED), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("enough_descriptors")
def test_more_than_2000_connections_each_publish_and_close(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server()
    queue = "many-connections"
    with contextlib.ExitStack() as stack:
        clients = []
        for n in range(CLIENTS):
            client = RawClient.connect(running.host, running.port, container_id=f"c{n}")
            stack.callback(client.abort)
            client.begin()
            client.wait_credit(client.attach("publisher", "sender", target=queue))
            clients.append(client)
        assert running.call(lambda: len(running.server.broker.connections)) == CLIENTS
        # Every connection still works once all are open, the first ones included.
        for n, client in enumerate(clients):
            delivery_id = client.send(0, Message(body=f"m{n}").encode())
            outcome = client.wait_outcomes([delivery_id])[delivery_id]
            assert outcome is not None
            assert outcome.name == "accepted"
        wait_until(lambda: running.queue(queue).ready == CLIENTS, timeout=60)
        for client in clients:
            assert client.close() is not None
    wait_until(lambda: running.call(lambda: len(running.server.broker.connections)) == 0)
    received = consume(running.url, queue, CLIENTS)
    assert len(received.bodies) == CLIENTS
