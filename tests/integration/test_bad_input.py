"""Bad input from one client closes that client's endpoint with the named condition, loses
nothing that was accepted, and leaves every other client working (issue "Foundation" §9)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import proton
import pytest
from integration.conftest import RunningServer
from proton.utils import BlockingConnection, LinkDetached
from support.clients import consume, publish
from support.raw_client import RawClient

# Small enough to make an oversized message cheap to send, large enough for normal ones.
_MAX_MESSAGE_SIZE = 64 * 1024


def _payload(body: bytes | str) -> bytes:
    encoded: bytes = proton.Message(body=body).encode()
    return encoded


def _publisher(
    server: RunningServer, address: str, max_frame_size: int = 65536
) -> tuple[RawClient, int]:
    client = RawClient.connect(server.host, server.port, max_frame_size=max_frame_size)
    client.begin()
    handle = client.attach("publisher", "sender", target=address)
    client.wait_attach(handle)
    client.wait_credit(handle)
    return client, handle


def _detach_error(client: RawClient) -> object:
    detach = client.wait_for("detach")
    assert detach["closed"] is True
    error = detach["error"]
    assert error is not None
    return error


def test_a_message_over_max_message_size_closes_the_link(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(max_message_size=_MAX_MESSAGE_SIZE)
    client, handle = _publisher(server, "/queues/oversized", max_frame_size=4096)
    with client:
        ok = client.send(handle, _payload("fits"))
        assert client.wait_outcomes([ok])[ok] is not None
        client.send(handle, _payload(b"x" * (_MAX_MESSAGE_SIZE + 1)))
        error = _detach_error(client)
        assert error["condition"] == "amqp:link:message-size-exceeded"  # type: ignore[index]
        assert str(_MAX_MESSAGE_SIZE) in error["description"]  # type: ignore[index]
    # The accepted message stays; the oversized one was never stored; others carry on.
    assert server.queue("oversized").ready == 1
    assert publish(server.url, "/queues/oversized", ["after"]).outcomes == ["accepted"]
    assert consume(server.url, "/queues/oversized", 2).bodies == ["fits", "after"]


def test_a_transfer_beyond_link_credit_closes_the_link(server: RunningServer) -> None:
    client, handle = _publisher(server, "/queues/over-credit")
    with client:
        granted = client.links[handle].link_credit
        # Far more than the credit in one burst: the server reads many transfers per read and
        # can have renewed at most a few times, so some transfer arrives with no credit.
        count = 20 * granted
        with client.corked():
            delivery_ids = [client.send(handle, _payload(f"m{i}")) for i in range(count)]
        error = _detach_error(client)
        assert error["condition"] == "amqp:link:transfer-limit-exceeded"  # type: ignore[index]
        outcomes = client.sessions[0].outcomes
        accepted = [i for i in delivery_ids if outcomes.get(i) is not None]
    assert 0 < len(accepted) < count
    # Every accepted message, and only those, is in the queue, in order.
    assert server.queue("over-credit").ready == len(accepted)
    received = consume(server.url, "/queues/over-credit", len(accepted))
    assert received.bodies == [f"m{delivery_ids.index(i)}" for i in accepted]


@pytest.mark.parametrize(
    "garbage",
    [b"GARBAGE!xxxx", b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", b"AMQP\x09\x01\x00\x00"],
)
def test_bytes_that_are_not_an_amqp_header_get_a_framing_error(
    server: RunningServer, garbage: bytes
) -> None:
    """Proton answers with its own header, an OPEN and a CLOSE naming the problem, then EOF."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(garbage)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"AMQP\x00\x01\x00\x00")
    assert b"amqp:connection:framing-error" in answer
    assert publish(server.url, "/queues/after-garbage", ["ok"]).outcomes == ["accepted"]


@pytest.mark.parametrize("role", ["consumer", "publisher"])
def test_an_attach_that_would_declare_a_queue_named_past_255_bytes_is_refused(
    server: RunningServer, role: str
) -> None:
    """RabbitMQ's limit on names: a queue's name is in every log record of its messages and every
    frame between workers, so a client may not make one of 64 KiB by attaching to it."""
    connection = BlockingConnection(server.url)
    try:
        address = "/queues/" + "q" * 256
        attach = connection.create_receiver if role == "consumer" else connection.create_sender
        with pytest.raises(LinkDetached) as refused:
            attach(address)
        assert refused.value.condition == "amqp:invalid-field"
        assert "longer than 255 bytes" in str(refused.value)
        connection.create_receiver("/queues/" + "q" * 255)
    finally:
        connection.close()
    assert server.queue("q" * 255).consumers == 0
