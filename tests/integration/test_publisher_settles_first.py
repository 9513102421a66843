"""A publisher may settle what it sent before the server does (AMQP 1.0 §2.6.12: a sender in
``unsettled`` or ``mixed`` mode settles a delivery whenever it is done with it, and may update its
state with a DISPOSITION of role sender). Proton reports such an update as an event for the
delivery, which the server took for the next transfer of the link: a message of no bytes was
routed and stored, a credit taken, and the link advanced past whatever delivery it was
receiving. Found following adversary seed 66159 (two workers), whose worker aborted in
``pn_delivery_settle`` as it settled a publisher's held delivery, confirmed by the other worker
after the publisher's connection had gone; the only path found where a held delivery is handled
twice.
"""

from __future__ import annotations

import proton
from integration.conftest import RunningServer
from support.clients import consume, publish
from support.raw_client import RawClient

MESSAGES = 10


def _payload(body: str) -> bytes:
    encoded: bytes = proton.Message(body=body).encode()
    return encoded


def _publisher(server: RunningServer, address: str) -> tuple[RawClient, int]:
    client = RawClient.connect(server.host, server.port, max_frame_size=4096)
    client.begin()
    handle = client.attach("settles-first", "sender", target=address, snd_settle_mode="mixed")
    client.wait_attach(handle)
    assert client.wait_credit(handle) >= MESSAGES
    return client, handle


def test_a_publisher_settling_its_transfers_first_stores_each_once(
    server: RunningServer,
) -> None:
    client, handle = _publisher(server, "/queues/settles-first")
    with client:
        credit = client.links[handle].link_credit
        # The server reads the transfers and the settlements together, before it answers any.
        with client.corked():
            ids = [client.send(handle, _payload(f"m{n}")) for n in range(MESSAGES)]
            client.disposition(ids[0], ids[-1], role="sender", settled=True, state="accepted")
        # A message it stores afterwards on the same link is told its outcome as before.
        last = client.send(handle, _payload("last"))
        assert client.wait_outcomes([last])[last] is not None
        assert client.links[handle].detach_frame is None
        # Each transfer took one credit: the settlements took none (before, each was routed
        # as a message of no bytes, refused, and took a credit).
        assert client.links[handle].link_credit >= credit - MESSAGES - 1
    assert server.queue("settles-first").ready == MESSAGES + 1
    received = consume(server.url, "/queues/settles-first", MESSAGES + 1).bodies
    assert received == [f"m{n}" for n in range(MESSAGES)] + ["last"]


def test_a_settlement_between_the_frames_of_a_delivery_leaves_it_whole(
    server: RunningServer,
) -> None:
    client, handle = _publisher(server, "/queues/settles-mid-delivery")
    big = _payload("y" * 20_000)
    with client:
        first = client.send(handle, _payload("first"))
        assert client.wait_outcomes([first])[first] is not None
        with client.corked():
            done = client.send(handle, _payload("done"))
            arriving = client.send(handle, big[:6000], finish=False)
            # The client settles the one it finished while the next is still arriving.
            client.disposition(done, role="sender", settled=True, state="accepted")
            client.send_more(handle, big[6000:13000])
            client.send_more(handle, big[13000:], finish=True)
        assert client.wait_outcomes([arriving])[arriving] is not None
        assert client.links[handle].detach_frame is None
    assert server.queue("settles-mid-delivery").ready == 3
    received = consume(server.url, "/queues/settles-mid-delivery", 3).bodies
    assert received == ["first", "done", "y" * 20_000]
    assert publish(server.url, "/queues/settles-mid-delivery", ["after"]).outcomes == ["accepted"]
