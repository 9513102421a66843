"""Worker 1 of two in a real reactor, its channel to worker 0 a socket pair whose other end a
test holds: it writes worker 0's frames itself and reads what worker 1 answers."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from proton.reactor import Container

from sluicegate.gateway import peers as peers_module
from sluicegate.gateway.peers import Peers
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.rules.vhosts import parse_vhosts
from sluicegate.gateway.supervisor import WorkerChannels
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.codec import FrameReader, encode
from sluicegate.session.channel.frames import Confirm, Publish, Settled, Stamp
from sluicegate.session.inbound_flow import InboundFlow, InboundLimits, queue_weight
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.sections import DEFAULT_HEADER

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


@contextmanager
def worker_one(tmp_path: Path, budget: MemoryBudget | None = None) -> Iterator[Worker1]:
    """Worker 1 serving its channel to worker 0 in a reactor; ``budget``: its inbound flow's
    (16 MiB by default)."""
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
        flow=InboundFlow(
            MemoryBudget(1 << 24) if budget is None else budget,
            InboundLimits(256, 1 << 20, 1 << 20),
        ),
        shorted=lambda link, size: None,
    )
    worker = Worker1(peers, registry, container, zero, supervisor)
    try:
        yield worker
    finally:
        sockets = [channel.sock for channel in peers.sockets.values()]
        peers.close()
        for sock in [*sockets, one, zero, worker.zero, supervisor, control]:
            sock.close()


def publish_frame(
    publish: int, queue: str, payloads: list[bytes], publisher: int, letters: bool = False
) -> bytes:
    """Worker 0's run of ``payloads`` to ``queue``, published on its link ``publisher`` (0:
    dead letters)."""
    stamps: list[Stamp] = [(None, DEFAULT_HEADER, 0)] * len(payloads)
    frame = Publish(publish, "/", queue, "", queue, payloads, stamps, letters, publisher)
    return b"".join(encode(frame))


def parked(worker: Worker1, frames: list[bytes]) -> None:
    """Worker 0's runs sent, and parked by worker 1, one at a time: the socket pair holds
    less than them all."""
    worker.container.timeout = 0.1  # a turn with nothing to read ends
    already = len(worker.peers._parked)
    for count, frame in enumerate(frames, already + 1):
        worker.send(frame)
        deadline = time.monotonic() + WITHIN
        while len(worker.peers._parked) < count:
            assert time.monotonic() < deadline
            worker.container.process()


def confirms(worker: Worker1, reader: FrameReader, wanted: int) -> dict[int, Settled]:
    """The outcomes worker 1 sent worker 0, by publish id, once ``wanted`` are in."""
    outcomes: dict[int, Settled] = {}
    worker.zero.settimeout(WITHIN)
    while len(outcomes) < wanted:
        for frame in reader.feed(worker.zero.recv(1 << 16)):
            if isinstance(frame, Confirm):
                for publish in range(frame.first, frame.last + 1):
                    outcomes[publish] = frame.outcome
    return outcomes


def weights_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the queues whose weight worker 1's parked walks read from now on, in
    order (gateway/peers.py reads them through ``queue_weight``)."""
    read: list[str] = []

    def counted(queue: QueueType) -> int:
        read.append(queue.name)
        return queue_weight(queue)

    monkeypatch.setattr(peers_module, "queue_weight", counted)
    return read
