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
from dataclasses import dataclass
from pathlib import Path

import pytest
from proton.reactor import Container

from sluicegate.gateway.peers import Peers
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.rules.vhosts import parse_vhosts
from sluicegate.gateway.supervisor import CHANNEL, WorkerChannels
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.codec import encode
from sluicegate.session.channel.frames import Kind, Query, QueryOp, Topology
from sluicegate.session.inbound_flow import InboundFlow, InboundLimits
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.encoding import encode as amqp

# The reactor's turns a test waits for its frames to be read, at most.
WITHIN = 5.0


class _NoRuntimeVhosts:
    def listing(self) -> dict[str, list[str]]:
        return {}

    def adopt(self, name: str, granted: list[str]) -> None:
        raise AssertionError("no virtual host is made here")

    def drop(self, name: str) -> None:
        raise AssertionError("no virtual host is dropped here")


@dataclass
class Worker1:
    """Worker 1 of two, its channel to worker 0 (whose end the test holds) in a reactor."""

    peers: Peers
    registry: QueueRegistry
    container: Container
    zero: socket.socket
    # The supervisor's end of worker 1's control socket.
    supervisor: socket.socket

    def send(self, data: bytes) -> None:
        self.zero.sendall(data)

    def turn_until_ended(self) -> None:
        deadline = time.monotonic() + WITHIN
        while 0 in self.peers.sockets and time.monotonic() < deadline:
            self.container.process()

    def zero_sees_the_end(self) -> bool:
        """Whether worker 0's end reads the end of the stream (after what 1 sent first)."""
        self.zero.settimeout(WITHIN)
        while True:
            data = self.zero.recv(1 << 16)
            if not data:
                return True


@pytest.fixture
def worker1(tmp_path: Path) -> Iterator[Worker1]:
    vhosts = parse_vhosts({})
    registry = QueueRegistry()
    tenancy = Tenancy(vhosts, {"/": registry})
    zero, one = socket.socketpair()
    supervisor, control = socket.socketpair()
    spec = WorkerChannels(1, 2, tmp_path, channels={0: one}, serials={0: 7}, control=control)
    peers = Peers(spec, {"/": registry})
    container = Container()
    container.start()
    peers.serve(
        tenancy,
        container,
        None,
        lambda dispatches: None,
        lambda link, messages: None,
        lambda link, reply: None,
        lambda link, error: None,
        lambda link: None,
        lambda registry, name: None,
        lambda registry, queue: None,
        max_message_size=1 << 20,
        max_queue_credit=256,
        filter_views=ViewCache(),
        vhosts=_NoRuntimeVhosts(),
        debt_of=lambda link: None,
        hold=lambda debt: None,
        flow=InboundFlow(MemoryBudget(1 << 24), InboundLimits(256, 1 << 20, 1 << 20)),
    )
    worker = Worker1(peers, registry, container, zero, supervisor)
    yield worker
    sockets = [channel.sock for channel in peers.sockets.values()]
    peers.close()
    for sock in [*sockets, one, zero, worker.zero, supervisor, control]:
        sock.close()


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
