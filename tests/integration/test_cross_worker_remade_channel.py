"""A channel one worker ends for a protocol error is made again by the supervisor (issue 35,
docs/workers.md): its consumers are detached as when the other worker dies, then attach again,
with no worker restarted; a peer that keeps breaking it waits longer each time."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message
from support.channel_ends import channel_end
from support.process import serving
from support.raw_client import RawClient
from support.workers import blocking_on, children, connection_on, homed_on, worker_of

from sluicegate.session.channel.remakes import FIRST_PAUSE

# A frame of a kind the channel protocol does not have: its size (the kind byte alone), then
# the kind. Worker 1 reads it from worker 0's end and ends the channel.
_BROKEN = struct.pack("<IB", 1, 0xEE)
# Seconds a test waits for the channel to be made again, on a loaded machine.
WITHIN = 30.0


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int], int]]:
    """A server of two workers: its port, its worker pids by index, and its supervisor."""
    off = ("--metrics-listen", "off", "--http-api-listen", "off")
    with serving(
        "--workers", "2", "--worker-handover", "false", "--data-dir", str(tmp_path), *off
    ) as (process, port):
        pids = children(process.pid)
        yield port, sorted(pids, key=worker_of), process.pid


def _break(pids: list[int]) -> None:
    """Write a broken frame into worker 0's end of its channel to worker 1."""
    with channel_end(pids[0], pids[1]) as end:
        end.sendall(_BROKEN)


def _attach_again(consumer: RawClient, queue: str) -> tuple[int, float]:
    """Attach to ``queue`` until its owner's channel is back: the handle, and when."""
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        handle = consumer.attach(f"again-{time.monotonic()}", "receiver", source=f"/queues/{queue}")
        attached = consumer.wait_attach(handle)
        if attached.error is None:
            return handle, time.monotonic()
        assert attached.error["condition"] == "amqp:resource-deleted", attached.error
        time.sleep(0.05)
    pytest.fail("the consumer could not attach again")


def test_a_channel_broken_by_a_peer_is_made_again_and_its_consumers_attach_again(
    two_workers: tuple[int, list[int], int],
) -> None:
    port, pids, supervisor = two_workers
    queue = homed_on(1, 2, "remade")
    consumer = connection_on(
        port, pids, pids[0], lambda: RawClient.connect("127.0.0.1", port), RawClient.abort
    )
    publisher = blocking_on(port, pids, pids[1])
    try:
        consumer.begin()
        handle = consumer.attach("first", "receiver", source=f"/queues/{queue}")
        assert consumer.wait_attach(handle).error is None
        consumer.flow(handle, link_credit=10)
        _break(pids)
        detach = consumer.wait_for("detach", timeout=WITHIN)
        assert detach["error"] is not None
        assert detach["error"]["condition"] == "amqp:resource-deleted"
        again, _ = _attach_again(consumer, queue)
        sender = publisher.create_sender(queue)
        sender.send(Message(body="after"))
        consumer.flow(again, link_credit=1)
        delivery = consumer.next_message(WITHIN)
        assert delivery is not None
        received = Message()
        received.decode(delivery.payload)
        assert received.body == "after"
        consumer.disposition(delivery.delivery_id)
        # Broken again at once: the second channel comes no sooner than twice the first pause.
        broken = time.monotonic()
        _break(pids)
        consumer.wait_for("detach", timeout=WITHIN)
        _, back = _attach_again(consumer, queue)
        assert back - broken >= 2 * FIRST_PAUSE
        # Neither worker was restarted: the supervisor made the channels.
        assert sorted(children(supervisor)) == sorted(pids)
    finally:
        consumer.abort()
        publisher.close()
