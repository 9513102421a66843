"""A plain connection whose first link names another worker's queue is handed to that worker
at its ATTACH, which serves it as if it had accepted it (docs/workers.md#handing-a-connection-over).

Real ``sluicegate serve --workers 2`` servers over 127.0.0.1, proton's blocking clients logging
in with SASL PLAIN; which worker serves a connection is read from ``/proc`` (the worker holding
its socket, tests/support/workers.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from proton import ConnectionException, Message, SSLDomain, Timeout
from proton.utils import BlockingConnection, BlockingReceiver
from support.certificates import self_signed
from support.polling import wait_until
from support.ports import free_port
from support.process import serving
from support.raw_client import RawClient
from support.workers import (
    children,
    connection_on,
    homed_on,
    placed_on,
    serving_worker,
    worker_of,
)

from sluicegate.gateway.handover import TIMEOUT
from sluicegate.gateway.rules.auth import hash_password

PASSWORD = "handover-password"
# Queues declared at start, one homed on each worker.
NEAR = homed_on(0, 2, "near")
FAR = homed_on(1, 2, "far")
# How long consumers sharing a queue are read for its messages, a short wait on each in turn.
SHARED_WAIT = 30.0
SHARED_POLL = 0.2
# Clients that attach to another worker's queue while it is stopped, then reset: more than the
# offers its socket holds, so that some descriptors wait in it and some offers are kept.
RESET_MID_HANDOVER = 12


@dataclass(frozen=True)
class Workers:
    """A server of two workers: its AMQP port, its worker pids by index, its endpoints."""

    port: int
    pids: list[int]
    metrics_port: int
    http_port: int

    def opened(self) -> Callable[[], BlockingConnection]:
        return lambda: BlockingConnection(
            f"amqp://127.0.0.1:{self.port}",
            timeout=20,
            user="alice",
            password=PASSWORD,
            allowed_mechs="PLAIN",
        )

    def on(self, worker: int) -> tuple[BlockingConnection, int]:
        """A connection the kernel gave worker ``worker``, and its local port."""
        return placed_on(
            self.port, self.pids, self.pids[worker], self.opened(), BlockingConnection.close
        )

    def served_by(self, local: int) -> int | None:
        """The index of the worker holding the server's end of the connection from ``local``."""
        pid = serving_worker(self.port, local, self.pids)
        return None if pid is None else self.pids.index(pid)

    def metric(self, name: str) -> float:
        """A sample of the server's one metrics page (every worker's added up)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=20) as page:
            for line in page.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"no {name} sample")

    def handovers(self) -> tuple[float, float, float]:
        """Connections given, taken and kept, over both workers."""
        return (
            self.metric("sluicegate_worker_connections_given_total"),
            self.metric("sluicegate_worker_connections_taken_total"),
            self.metric("sluicegate_worker_connections_kept_total"),
        )

    def listed(self) -> list[str]:
        """The connections worker 0's HTTP API lists, by name."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}/api/connections")
        token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", "Basic " + token)
        with urllib.request.urlopen(request, timeout=20) as response:
            return [entry["name"] for entry in json.loads(response.read())]


@contextlib.contextmanager
def _workers(root: Path, *options: str, settings: str = "") -> Iterator[Workers]:
    config = root / "sluicegate.toml"
    config.write_text(
        settings + f'[users.alice]\npassword_hash = "{hash_password(PASSWORD)}"\n'
        'tags = ["administrator"]\n'
        f'[[queues]]\nname = "{NEAR}"\n[[queues]]\nname = "{FAR}"\n'
    )
    metrics, http = free_port(), free_port()
    listens = ("--metrics-listen", f"127.0.0.1:{metrics}", "--http-api-listen", f"127.0.0.1:{http}")
    with serving(
        "--config",
        str(config),
        "--workers",
        "2",
        "--data-dir",
        str(root / "data"),
        "--http-connection-listing-delay",
        "0",
        *listens,
        *options,
    ) as (process, port):
        pids = sorted(children(process.pid), key=worker_of)
        yield Workers(port, pids, metrics, http)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    with _workers(tmp_path_factory.mktemp("handover")) as served:
        yield served


def _body(message: Message) -> str:
    assert isinstance(message.body, str)
    return message.body


def _received(receiver: BlockingReceiver, count: int) -> list[str]:
    bodies = []
    for _ in range(count):
        message = receiver.receive(timeout=20)
        receiver.accept()
        bodies.append(_body(message))
    return bodies


def _shared(receivers: tuple[BlockingReceiver, ...], count: int) -> list[str]:
    """``count`` bodies from consumers sharing a queue, however the queue splits them (one
    on another worker gets a batch later than one beside the queue)."""
    bodies: list[str] = []
    deadline = time.monotonic() + SHARED_WAIT
    while len(bodies) < count and time.monotonic() < deadline:
        for receiver in receivers:
            with contextlib.suppress(Timeout):
                message = receiver.receive(timeout=SHARED_POLL)
                receiver.accept()
                bodies.append(_body(message))
    return bodies


def test_a_consumer_and_a_publisher_of_another_workers_queue_end_up_on_its_worker(
    workers: Workers,
) -> None:
    given, taken, kept = workers.handovers()
    consumer, consumer_port = workers.on(0)
    publisher, publisher_port = workers.on(0)
    try:
        receiver = consumer.create_receiver(f"/queues/{FAR}", credit=100)
        sender = publisher.create_sender(f"/queues/{FAR}")
        # Only worker 1 holds their sockets now: their messages never cross the channel.
        wait_until(lambda: workers.served_by(consumer_port) == 1)
        wait_until(lambda: workers.served_by(publisher_port) == 1)
        for n in range(300):
            sender.send(Message(body=f"m-{n}"))
        assert _received(receiver, 300) == [f"m-{n}" for n in range(300)]
        assert workers.handovers() == (given + 2, taken + 2, kept)
    finally:
        consumer.close()
        publisher.close()


def test_a_connection_with_links_to_queues_on_both_workers_keeps_crossing(
    workers: Workers,
) -> None:
    given, taken, kept = workers.handovers()
    # First link to its own worker's queue: it stays, and its second link crosses.
    staying, staying_port = workers.on(0)
    # First link to the other worker's queue: it moves, and its second link crosses back.
    moving, moving_port = workers.on(0)
    publisher, _ = workers.on(1)
    try:
        near_first = staying.create_receiver(f"/queues/{NEAR}", credit=50)
        far_second = staying.create_receiver(f"/queues/{FAR}", credit=50)
        far_first = moving.create_receiver(f"/queues/{FAR}", credit=50)
        near_second = moving.create_receiver(f"/queues/{NEAR}", credit=50)
        wait_until(lambda: workers.served_by(moving_port) == 1)
        assert workers.served_by(staying_port) == 0
        to_far = publisher.create_sender(f"/queues/{FAR}")  # its own worker's: it stays
        to_near = publisher.create_sender(f"/queues/{NEAR}")
        for n in range(20):
            to_near.send(Message(body=f"near-{n}"))
            to_far.send(Message(body=f"far-{n}"))
        # Each queue's messages split between its two consumers, none lost.
        near = sorted(_shared((near_first, near_second), 20))
        far = sorted(_shared((far_first, far_second), 20))
        assert near == sorted(f"near-{n}" for n in range(20))
        assert far == sorted(f"far-{n}" for n in range(20))
        assert workers.handovers() == (given + 1, taken + 1, kept)
        assert workers.served_by(staying_port) == 0
    finally:
        staying.close()
        moving.close()
        publisher.close()


def test_a_handed_over_connection_is_listed_and_counted_once_and_leaves_nothing(
    workers: Workers,
) -> None:
    connections = workers.metric("sluicegate_connections")
    records = workers.metric("sluicegate_connection_records")
    # Accepted by worker 1, its queue on worker 0, whose HTTP API lists it once it is there.
    client, local = workers.on(1)
    name = f"127.0.0.1:{local} -> 127.0.0.1:{workers.port}"
    try:
        assert name not in workers.listed()
        receiver = client.create_receiver(f"/queues/{NEAR}", credit=10)
        wait_until(lambda: workers.served_by(local) == 0)
        assert workers.listed().count(name) == 1
        assert workers.metric("sluicegate_connections") == connections + 1
        sender = client.create_sender(f"/queues/{NEAR}")
        sender.send(Message(body="listed"))
        assert _received(receiver, 1) == ["listed"]
    finally:
        client.close()
    wait_until(lambda: name not in workers.listed())
    wait_until(lambda: workers.metric("sluicegate_connections") == connections)
    wait_until(lambda: workers.metric("sluicegate_connection_records") <= records)


@pytest.mark.slow
def test_connection_limits_follow_the_connection_and_a_full_worker_refuses_it(
    tmp_path: Path,
) -> None:
    # max_connections is split over the workers: one each.
    with _workers(tmp_path, "--max-connections", "2") as workers:
        moved, moved_port = workers.on(0)
        publisher = moved.create_sender(f"/queues/{FAR}")
        wait_until(lambda: workers.served_by(moved_port) == 1)
        # Worker 0 let its count go: it takes another connection (worker 1, full, refuses
        # those the kernel gives it at their OPEN, and the client tries again).
        opened = workers.opened()

        def retried() -> BlockingConnection:
            while True:
                with contextlib.suppress(ConnectionException):
                    return opened()

        kept, kept_port = placed_on(
            workers.port, workers.pids, workers.pids[0], retried, BlockingConnection.close
        )
        given, taken, kept_before = workers.handovers()
        # Worker 1 refuses to take one more: it stays on worker 0 and crosses.
        receiver = kept.create_receiver(f"/queues/{FAR}", credit=10)
        publisher.send(Message(body="crossed"))
        assert _received(receiver, 1) == ["crossed"]
        assert workers.served_by(kept_port) == 0
        assert workers.handovers() == (given, taken, kept_before + 1)
        kept.close()
        moved.close()


@pytest.mark.slow
def test_an_offer_the_other_worker_does_not_answer_in_time_is_served_where_it_is(
    tmp_path: Path,
) -> None:
    with _workers(tmp_path) as workers:
        client, local = workers.on(0)
        publisher = client.create_sender(f"/queues/{NEAR}")  # its own worker's: it stays
        other, other_port = workers.on(0)
        os.kill(workers.pids[1], signal.SIGSTOP)
        try:
            started = time.monotonic()
            # Offered to a stopped worker: no answer, so worker 0 attaches it itself once the
            # offer's time is up; the crossing ATTACH's reply waits for worker 1.
            sender = other.create_sender(f"/queues/{FAR}")
            assert time.monotonic() - started >= 1.5
        finally:
            os.kill(workers.pids[1], signal.SIGCONT)
        sender.send(Message(body="kept"))
        receiver = client.create_receiver(f"/queues/{FAR}", credit=10)
        assert _received(receiver, 1) == ["kept"]
        assert workers.served_by(other_port) == 0
        assert workers.served_by(local) == 0
        publisher.send(Message(body="still"))
        assert workers.handovers()[2] >= 1
        client.close()
        other.close()


@pytest.mark.slow
def test_an_offer_beyond_the_bound_keeps_its_worker_at_once(tmp_path: Path) -> None:
    with _workers(tmp_path, "--max-pending-handovers", "1") as workers:
        port = workers.port
        waiting = connection_on(
            port,
            workers.pids,
            workers.pids[0],
            lambda: RawClient.connect("127.0.0.1", port, plain=("alice", PASSWORD)),
            RawClient.abort,
        )
        other, other_port = workers.on(0)
        os.kill(workers.pids[1], signal.SIGSTOP)
        try:
            waiting.begin()
            # Offered to the stopped worker: the one hand-over worker 0 may have under way.
            handle = waiting.attach("waits", "sender", target=f"/queues/{FAR}")
            time.sleep(0.3)
            started = time.monotonic()
            # No room for a second offer: attached here at once, not after the offer's time.
            other.create_sender(f"/queues/{FAR}")
            assert time.monotonic() - started < TIMEOUT
            assert waiting.wait_attach(handle).error is None
        finally:
            os.kill(workers.pids[1], signal.SIGCONT)
        assert workers.served_by(other_port) == 0
        assert workers.handovers()[2] == 2
        waiting.abort()
        other.close()


@pytest.mark.slow
def test_a_tls_connection_is_never_handed_over(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "localhost", "DNS:localhost,IP:127.0.0.1")
    tls_port = free_port()
    tls = f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    with _workers(tmp_path, "--tls-listen", f"127.0.0.1:{tls_port}", settings=tls) as workers:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(str(cert))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, str(cert))
        client, local = placed_on(
            tls_port,
            workers.pids,
            workers.pids[0],
            lambda: BlockingConnection(
                f"amqps://localhost:{tls_port}",
                timeout=20,
                ssl_domain=domain,
                user="alice",
                password=PASSWORD,
                allowed_mechs="PLAIN",
            ),
            BlockingConnection.close,
        )
        try:
            sender = client.create_sender(f"/queues/{FAR}")
            receiver = client.create_receiver(f"/queues/{FAR}", credit=10)
            sender.send(Message(body="over tls"))
            assert _received(receiver, 1) == ["over tls"]
            assert serving_worker(tls_port, local, workers.pids) == workers.pids[0]
            assert workers.handovers() == (0, 0, 0)
        finally:
            client.close()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _server_sockets(port: int) -> int:
    """The server's TCP sockets on ``port`` in any state but LISTEN (Linux's /proc)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] != "0A":
            count += 1
    return count


@pytest.mark.slow
def test_clients_that_reset_mid_handover_leave_nothing_on_either_worker(tmp_path: Path) -> None:
    """Offers whose descriptors wait in a stopped worker's socket, their clients reset
    meanwhile (issue 31's attack on the hand-over): each worker's descriptors, its connections
    and the server's TCP sockets come back to what they were, and hand-overs go on."""
    with _workers(tmp_path) as workers:
        port = workers.port
        # After a scrape, as at the end: a worker holds its metrics connection a while.
        connections = workers.metric("sluicegate_connections")
        base = [_descriptors(pid) for pid in workers.pids]
        clients = [
            connection_on(
                port,
                workers.pids,
                workers.pids[0],
                lambda: RawClient.connect("127.0.0.1", port, plain=("alice", PASSWORD)),
                RawClient.abort,
            )
            for _ in range(RESET_MID_HANDOVER)
        ]
        os.kill(workers.pids[1], signal.SIGSTOP)
        try:
            for number, client in enumerate(clients):
                client.begin()
                client.attach(f"reset-{number}", "receiver", source=f"/queues/{FAR}")
            time.sleep(0.3)
            for client in clients:
                client.reset()
            time.sleep(0.3)
        finally:
            os.kill(workers.pids[1], signal.SIGCONT)
        wait_until(lambda: workers.metric("sluicegate_connections") == connections, 20)
        wait_until(lambda: _server_sockets(port) == 0, 20)
        wait_until(
            lambda: all(_descriptors(pid) <= n for pid, n in zip(workers.pids, base, strict=True)),
            20,
        )
        given = workers.handovers()[0]
        after, local = workers.on(0)
        try:
            after.create_receiver(f"/queues/{FAR}", credit=1)
            wait_until(lambda: workers.served_by(local) == 1)
            assert workers.handovers()[0] == given + 1
        finally:
            after.close()
