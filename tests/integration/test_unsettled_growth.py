"""A consumer that takes deliveries and settles none, while the memory budget is blocked
(session/unsettled.py).

Each unsettled delivery costs the server 512 bytes beyond its message. Before, a consumer
granting 100,000 credit on a queue of 12,000 small messages took an 8 MiB budget, blocked by a
queue nobody reads, to 14.6 MB against its 9 MiB ceiling, and every publisher on the server,
polite or not, waited for as long as it stayed. Held only as the holds were decided, at the
end of a pass, 32 links of clients that never read took a batch of 256 each first, and shares
decided before they grew let each take one of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import proton
from integration.conftest import RunningServer
from integration.test_consumer_budget import _fill_until_held
from proton.utils import BlockingConnection, BlockingReceiver, SendException
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient

KiB: Final = 1024
MiB: Final = 1024 * KiB
SMALL: Final = 12_000


def _take(receiver: BlockingReceiver, most: int) -> int:
    """Receive, settling nothing, until nothing comes for a second or ``most`` came."""
    taken = 0
    while taken < most:
        try:
            receiver.receive(timeout=1)
        except proton.Timeout:
            break
        taken += 1
    return taken


def _polite_publish(server: RunningServer) -> bool:
    connection = BlockingConnection(server.url, timeout=10)
    sender = connection.create_sender("/queues/polite")
    try:
        sender.send(proton.Message(body=b"polite"), timeout=5)
    except (proton.Timeout, SendException):
        return False
    connection.close()
    return True


def test_a_consumer_settling_nothing_is_held_before_it_takes_the_publishers_part(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(memory_budget=8 * MiB)
    budget = server.server.broker.publishing.budget
    assert publish(server.url, "/queues/small", [b"s" * 100] * SMALL).outcomes == (
        ["accepted"] * SMALL
    )
    # Its publisher held, the budget blocked (the connection stays until the server stops).
    assert _fill_until_held(server, "nobody-reads") > 0
    hoarder = BlockingConnection(server.url, timeout=30)
    receiver = hoarder.create_receiver("/queues/small", credit=100_000)
    taken = _take(receiver, SMALL)
    # Held once it grew by its share of the publishers' part: a fraction of the queue.
    assert 0 < taken < SMALL // 2, f"{taken} deliveries taken unsettled"
    level, ceiling = server.call(
        lambda: (budget.publishing_level(budget.current), budget.publishing_ceiling)
    )
    assert level < ceiling, f"publishers' level {level} past their ceiling {ceiling}"
    assert _polite_publish(server)
    # Settled, it is let go at the next decision and takes more.
    for _ in range(taken):
        receiver.accept()
    assert _take(receiver, SMALL) > 0
    unsettled = server.call(lambda: server.server.broker.sending.unsettled)
    hoarder.close()
    # Nothing of it is left once it is gone.
    wait_until(lambda: server.call(lambda: (unsettled.count, len(unsettled.since))) == (0, 0))
    assert server.call(lambda: len(unsettled.held)) == 0


def test_many_links_that_never_read_take_no_more_than_the_room_left(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(memory_budget=8 * MiB)
    broker = server.server.broker
    budget = broker.publishing.budget
    assert publish(server.url, "/queues/small", [b"s" * 100] * SMALL).outcomes == (
        ["accepted"] * SMALL
    )
    assert _fill_until_held(server, "nobody-reads") > 0
    clients = []
    for number in range(4):
        client = RawClient.connect(
            server.host, server.port, container_id=f"never-reads-{number}", rcvbuf=4 * KiB
        )
        client.begin(0)
        handles = [client.attach(f"u{n}", "receiver", source="/queues/small") for n in range(8)]
        for handle in handles:
            assert client.wait_attach(handle).error is None
        for handle in handles:
            client.flow(handle, link_credit=10_000)
        clients.append(client)
    unsettled = broker.sending.unsettled
    last = -1
    while (now := server.call(lambda: unsettled.count)) != last:
        last = now
        time.sleep(1)
    level, ceiling = server.call(
        lambda: (budget.publishing_level(budget.current), budget.publishing_ceiling)
    )
    # Before: 11,264 deliveries, the level 14.1 MB; held at the flushes only, 2,240.
    assert now < SMALL // 4, f"{now} deliveries taken unsettled"
    assert level < ceiling, f"publishers' level {level} past their ceiling {ceiling}"
    assert _polite_publish(server)
    for client in clients:
        client.reset()
    wait_until(lambda: server.call(lambda: (unsettled.count, len(unsettled.since))) == (0, 0))
    assert server.call(lambda: (len(unsettled.held), len(unsettled.reached))) == (0, 0)
