"""Each limit's error condition, with a frame-level client that can break every one of them
(issue 10 §6): max connections, channel-max, links per session, max frame size, idle timeout."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from integration.conftest import RunningServer
from proton import Message, uint
from support.frames import AMQP_HEADER, HEARTBEAT, SASL_HEADER, described, encode_frame
from support.polling import wait_until
from support.raw_client import RawClient


def _open_count(running: RunningServer) -> int:
    return running.call(lambda: len(running.server.broker.connections))


def test_one_connection_over_max_connections_is_closed_at_open(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(max_connections=2)
    first = RawClient.connect(running.host, running.port)
    second = RawClient.connect(running.host, running.port)
    with RawClient.connect(running.host, running.port) as third:
        close = third.wait_for("close")
    assert close["error"]["condition"] == "amqp:resource-limit-exceeded"
    assert "2" in close["error"]["description"]
    # The two within the limit carry on; closing one makes room for another.
    with first, second:
        second.begin()
        first.close()
        wait_until(lambda: _open_count(running) == 1)
        with RawClient.connect(running.host, running.port) as fourth:
            fourth.begin()


def test_a_channel_above_channel_max_closes_the_connection(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(channel_max=1)
    with RawClient.connect(running.host, running.port) as client:
        assert client.peer_open is not None
        assert client.peer_open["channel_max"] == 1
        client.begin(channel=1)
        begin = described(
            "begin", next_outgoing_id=uint(0), incoming_window=uint(10), outgoing_window=uint(10)
        )
        client.send_raw(encode_frame(2, begin))
        close = client.wait_for("close")
    assert close["error"]["condition"] == "amqp:connection:framing-error"
    assert "channel_max" in close["error"]["description"]


def test_one_link_over_the_session_limit_is_refused(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(max_links_per_session=2)
    with RawClient.connect(running.host, running.port) as client:
        client.begin()
        first = client.attach("a", "sender", target="/queues/links")
        second = client.attach("b", "receiver", source="/queues/links")
        assert client.wait_attach(first).error is None
        assert client.wait_attach(second).error is None
        third = client.wait_attach(client.attach("c", "sender", target="/queues/links"))
        assert third.error is not None
        assert third.error["condition"] == "amqp:resource-limit-exceeded"
        # Another session has its own allowance; the first links still work.
        client.begin(channel=1)
        other = client.attach("d", "sender", target="/queues/links", channel=1)
        assert client.wait_attach(other).error is None
        client.wait_credit(first)
        delivery = client.send(first, Message(body="still here").encode())
        outcome = client.wait_outcomes([delivery])[delivery]
        assert outcome is not None
        assert outcome.name == "accepted"


def test_a_frame_over_max_frame_size_closes_the_connection(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(max_frame_size=512)
    with RawClient.connect(running.host, running.port, max_frame_size=512) as client:
        assert client.peer_max_frame_size == 512
        client.begin()
        handle = client.attach("p", "sender", target="/queues/frames")
        client.wait_credit(handle)
        transfer = described(
            "transfer", handle=uint(handle), delivery_id=uint(0), delivery_tag=b"0"
        )
        client.send_raw(encode_frame(0, transfer, Message(body="x" * 2000).encode()))
        close = client.wait_for("close")
    assert close["error"]["condition"] == "amqp:connection:framing-error"
    assert running.queue("frames").ready == 0


@pytest.mark.slow
def test_a_silent_client_is_dropped_and_a_heartbeating_one_is_not(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(idle_timeout=0.5)
    with RawClient.connect(running.host, running.port) as alive:
        # The server announces half its timeout, as proton does, so clients beat in time.
        assert alive.peer_idle_timeout_ms is not None
        assert alive.peer_idle_timeout_ms <= 500
        # Reading for four timeouts sends heartbeats (RawClient beats at half the timeout).
        assert alive.expect_nothing(2.0) == []
        alive.begin()
    with RawClient.connect(running.host, running.port) as silent:
        silent.peer_idle_timeout_ms = None  # never send a heartbeat
        close = silent.wait_for("close", timeout=30)
        assert close["error"]["condition"] == "amqp:resource-limit-exceeded"
    wait_until(lambda: _open_count(running) == 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "first_bytes", [b"", SASL_HEADER, SASL_HEADER + b"\x00\x00"], ids=["nothing", "header", "part"]
)
def test_a_client_that_does_not_log_in_is_dropped_after_handshake_timeout(
    make_server: Callable[..., RunningServer], first_bytes: bytes
) -> None:
    running = make_server(handshake_timeout=0.5)
    with socket.create_connection((running.host, running.port), timeout=30) as sock:
        sock.sendall(first_bytes)
        while sock.recv(65536):
            pass  # the server's SASL header and mechanisms, then EOF
    wait_until(lambda: _open_count(running) == 0)
    # A client that logs in at once is not affected.
    with RawClient.connect(running.host, running.port) as client:
        assert client.expect_nothing(1.0) == []
        client.begin()


@pytest.mark.slow
def test_the_server_sends_heartbeats_at_half_the_clients_idle_timeout(
    server: RunningServer,
) -> None:
    open_frame = described("open", container_id="beats", idle_time_out=uint(200))
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(AMQP_HEADER + encode_frame(0, open_frame))
        received = bytearray()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                received += sock.recv(65536)
            except TimeoutError:
                break
    # Our header, the server's OPEN, then empty frames (§2.4.5) about every 100 ms.
    assert received.startswith(AMQP_HEADER)
    assert received.count(HEARTBEAT) >= 5
