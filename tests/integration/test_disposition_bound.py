"""A ranged DISPOSITION whose outcome proton would copy past the memory budget closes its
connection before proton decodes it (issue 31).

Proton copies a DISPOSITION's outcome into every unsettled delivery of its range while it
decodes the frame, before the server sees an event: one ``modified`` outcome of 100 KB of
annotations over 3,000 deliveries took RSS from 43 to 709 MiB at a 64 MiB budget. The gateway
weighs each DISPOSITION's size times the deliveries it reaches on its way to proton
(gateway/disposition_bound.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from integration.conftest import RunningServer
from proton import Message, symbol
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient
from support.resident import rss

MiB: Final = 1024 * 1024
DELIVERIES: Final = 3000
ANNOTATION: Final = 60_000  # under max_message_annotations_size: only the range makes it costly


def _take_all(client: RawClient, address: str) -> None:
    client.begin()
    handle = client.attach("modifier", "receiver", source=address)
    assert client.wait_attach(handle).error is None
    client.flow(handle, link_credit=DELIVERIES)
    for _ in range(DELIVERIES):
        assert client.next_message(timeout=30) is not None


def test_a_modified_range_that_proton_would_copy_past_the_budget_closes_the_connection(
    make_server: Callable[..., RunningServer],
) -> None:
    """60 KB of annotations over 3,000 unsettled deliveries, 180 MB of copies at a 64 MiB
    budget: the connection is closed with amqp:resource-limit-exceeded before proton decodes
    the frame, RSS does not move, every message is back in its queue unchanged, and the next
    client is served."""
    running = make_server(memory_budget=64 * MiB)
    address = "/queues/modified-range"
    messages = [Message(body=f"m{n}") for n in range(DELIVERIES)]
    assert publish(running.url, address, messages=messages).outcomes == ["accepted"] * DELIVERIES
    with RawClient.connect(running.host, running.port, max_frame_size=MiB) as client:
        _take_all(client, address)
        before = rss(os.getpid())
        annotations: dict[symbol, object] = {symbol("x-why"): "v" * ANNOTATION}
        client.disposition(0, DELIVERIES - 1, state=("modified", True, False, annotations))
        close = client.wait_for("close", timeout=60)
        grown = rss(os.getpid()) - before
    assert close["error"]["condition"] == "amqp:resource-limit-exceeded"
    assert f"over {DELIVERIES} deliveries" in close["error"]["description"]
    assert grown < 16 * MiB, f"RSS grew by {grown / MiB:.0f} MiB"
    wait_until(lambda: running.queue("modified-range").ready == DELIVERIES)
    assert not running.call(lambda: running.server.broker.publishing.budget.blocked)
    assert publish(running.url, address, messages=[Message(body="p")]).outcomes == ["accepted"]


def test_a_modified_range_within_the_budget_still_reaches_its_messages(
    make_server: Callable[..., RunningServer],
) -> None:
    """The same outcome over 300 deliveries (18 MB of copies) fits: it is applied, each message
    comes back with the annotations."""
    running = make_server(memory_budget=64 * MiB)
    address = "/queues/modified-small-range"
    count = 300
    messages = [Message(body=f"m{n}") for n in range(count)]
    assert publish(running.url, address, messages=messages).outcomes == ["accepted"] * count
    with RawClient.connect(running.host, running.port, max_frame_size=MiB) as client:
        client.begin()
        handle = client.attach("modifier", "receiver", source=address)
        assert client.wait_attach(handle).error is None
        client.flow(handle, link_credit=count)
        for _ in range(count):
            assert client.next_message(timeout=30) is not None
        annotations: dict[symbol, object] = {symbol("x-why"): "v" * ANNOTATION}
        client.disposition(0, count - 1, state=("modified", False, False, annotations))
        client.detach(handle)
        client.wait_for("detach", timeout=30)
    wait_until(lambda: running.queue("modified-small-range").ready == count)
