"""A durable message redelivered after a failed delivery arrives whole in several TRANSFERs.

A failed delivery raises the header's delivery-count, which rewrites (or inserts) the header: the
bytes sent grow. A consumer whose session window holds fewer frames than the message gets it in
parts (session/outbound.py ``TransferPart``), sliced by the size the queue reports, which must be
that of the bytes sent, or the message arrives truncated.
"""

from __future__ import annotations

import pytest
from integration.conftest import RunningServer
from proton import Message
from proton.utils import BlockingConnection
from support.raw_client import Delivery, RawClient

# Far below the body's size: the message needs about nine TRANSFER frames.
MAX_FRAME_SIZE = 512
BODY = bytes(range(256)) * 16
# Fewer frames than the message needs: the server sends it in parts, a window at a time.
WINDOW = 4
# How long a stalled part waits before the window is reopened.
STALL = 0.3


def _receive(client: RawClient) -> Delivery:
    """The next message, reopening the session window each time the server stops for it."""
    for _ in range(100):
        delivery = client.next_message(timeout=STALL)
        if delivery is not None:
            return delivery
        client.flow(incoming_window=WINDOW)
    raise AssertionError("no whole message")


@pytest.mark.parametrize("with_header", [False, True])
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_failed_multiframe_durable_delivery_comes_back_whole(
    server: RunningServer, queue_type: str, with_header: bool
) -> None:
    name = f"redeliver-{queue_type}-{with_header}"
    server.call(
        lambda: server.server.registry.declare_queue(
            name, {"x-queue-type": queue_type}, durable=True
        )
    )
    publisher = BlockingConnection(server.url, timeout=30)
    # Proton writes a header only when a field differs from its default; a non-durable message
    # stays in memory (its payload is rewritten, so its size was always right).
    publisher.create_sender(f"/queues/{name}").send(Message(body=BODY, durable=with_header))
    publisher.close()
    client = RawClient.connect(server.host, server.port, max_frame_size=MAX_FRAME_SIZE)
    client.begin(incoming_window=WINDOW)
    handle = client.attach("r", "receiver", source=f"/queues/{name}")
    client.flow(handle, link_credit=1)
    first = _receive(client)
    assert first.frames > WINDOW
    decoded = Message()
    decoded.decode(first.payload)
    assert decoded.body == BODY
    for attempt in range(1, 4):
        client.disposition(first.delivery_id, state=("modified", True, False))
        client.flow(handle, link_credit=1)
        again = _receive(client)
        decoded = Message()
        decoded.decode(again.payload)
        assert decoded.body == BODY
        assert decoded.delivery_count == attempt
        first = again
    client.disposition(first.delivery_id)
    client.close()
