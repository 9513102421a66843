"""A peer worker that sends a malformed frame (docs/workers.md, issue 35): the channel ends
cleanly, logged and counted, its consumers and publishes end as when the peer dies, and no
exception reaches the reactor; the worker asks its supervisor for a new channel, which opens
as after a restart. Worker 1's side runs in a real reactor over real socket pairs; the test
writes worker 0's bytes itself and plays the supervisor on the control socket."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.worker_one import WITHIN, Worker1, worker_one

from sluicegate.gateway.supervisor import CHANNEL
from sluicegate.session.channel.codec import encode
from sluicegate.session.channel.frames import Kind, Query, QueryOp, Topology
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.encoding import encode as amqp


@pytest.fixture
def worker1(tmp_path: Path) -> Iterator[Worker1]:
    with worker_one(tmp_path) as worker:
        yield worker


def _topology(change: bytes) -> bytes:
    body = struct.pack("<H", 1) + b"/" + struct.pack("<I", len(change)) + change
    return struct.pack("<IB", len(body) + 1, Kind.TOPOLOGY) + body


def test_a_topology_change_that_does_not_decode_ends_the_channel_and_is_counted(
    worker1: Worker1, caplog: pytest.LogCaptureFixture
) -> None:
    exchange: list[Value] = ["exchange", "x", "fanout", {}, True, False, False]
    worker1.send(b"".join(encode(Topology("/", amqp(exchange)))))
    deadline = time.monotonic() + WITHIN
    while not any(x.name == "x" for x in worker1.registry.exchanges()):
        assert time.monotonic() < deadline
        worker1.container.process()
    worker1.send(_topology(b"\xff\x01"))
    worker1.turn_until_ended()
    assert 0 not in worker1.peers.sockets
    assert worker1.peers.protocol_errors == 1
    assert "broke the channel protocol: a topology change does not decode" in caplog.text
    assert worker1.zero_sees_the_end()
    # Worker 0's queues are out of reach until a channel serves again, as when it dies.
    assert not worker1.peers.remotes[0].up
    # Worker 1 asked its supervisor for a new channel, naming the one it ended.
    worker1.supervisor.settimeout(WITHIN)
    assert CHANNEL.unpack(worker1.supervisor.recv(CHANNEL.size)) == (0, 7)
    # The supervisor's new channel opens as one after a restart: everything worker 1 knows
    # goes first, and worker 0's frames are read again.
    zero, one = socket.socketpair()
    socket.send_fds(worker1.supervisor, [CHANNEL.pack(0, 8)], [one.fileno()])
    one.close()
    deadline = time.monotonic() + WITHIN
    remote = worker1.peers.remotes[0]
    while not remote.up:
        assert time.monotonic() < deadline
        worker1.container.process()
    assert worker1.peers.serials[0] == 8
    worker1.zero.close()
    worker1.zero = zero
    worker1.peers.sockets[0].flush()
    zero.settimeout(WITHIN)
    assert b"exchange" in zero.recv(1 << 16)
    again: list[Value] = ["exchange", "y", "fanout", {}, True, False, False]
    worker1.send(b"".join(encode(Topology("/", amqp(again)))))
    while not any(x.name == "y" for x in worker1.registry.exchanges()):
        assert time.monotonic() < deadline
        worker1.container.process()


def test_a_declaration_that_is_no_queue_declaration_ends_the_channel(
    worker1: Worker1, caplog: pytest.LogCaptureFixture
) -> None:
    # Well-formed AMQP, but a binding where the owner expects a queue's declaration.
    wrong = amqp(["bind", "amq.fanout", "q", "", {}, False])
    worker1.send(b"".join(encode(Query(1, QueryOp.DECLARE, "/", "q", wrong))))
    worker1.turn_until_ended()
    assert worker1.peers.protocol_errors == 1
    assert worker1.registry.get("q") is None
    assert "that is not one" in caplog.text
    assert worker1.zero_sees_the_end()
