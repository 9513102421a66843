"""RabbitMQ's ``POST /api/exchanges/{vhost}/{name}/publish`` against a real server: routing,
consumers served at once, the log's confirmation before the reply, and the attacks (a huge
payload, no permission, a full memory budget, a queue or exchange that does not exist)."""

from __future__ import annotations

import base64
import functools
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from integration.conftest import RunningServer, start_server
from integration.test_http_api import EVERYTHING, PASSWORD, call
from proton.utils import BlockingConnection
from support.polling import wait_until

from sluicegate.gateway.rules.auth import User, hash_password, parse_users

# The server's cap on one message for the size test: far under the HTTP body cap (64 KiB).
SMALL_MESSAGE_SIZE = 4096
# The memory budget for the budget test: a few messages of PAYLOAD_SIZE.
SMALL_BUDGET = 256 * 1024
PAYLOAD_SIZE = 40_000
# Queues bound to amq.fanout: their copies of one PAYLOAD_SIZE message pass SMALL_BUDGET.
FAN_OUT = 8


def _publish(
    running: RunningServer, exchange: str, key: str, payload: str, **extra: Any
) -> tuple[int, Any]:
    """A publish as alice (on a server without users, as the anonymous user)."""
    body = {"properties": {}, "routing_key": key, "payload": payload, **extra}
    user = "alice" if running.server.config.users else None
    return call(running, "POST", f"/exchanges/%2F/{exchange}/publish", body, user=user)


@functools.cache
def _users() -> dict[str, User]:
    hashed = hash_password(PASSWORD)
    return parse_users(
        {
            "alice": {"password_hash": hashed, "permissions": {"/": EVERYTHING}},
            "bob": {
                "password_hash": hashed,
                "permissions": {"/": {"configure": ".*", "write": "^bob-", "read": ".*"}},
            },
        }
    )


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    server = start_server(users=_users(), max_message_size=SMALL_MESSAGE_SIZE)
    yield server
    server.stop()


def test_publish_to_a_queue_reaches_a_waiting_consumer(running: RunningServer) -> None:
    """The default exchange routes by queue name; a consumer already waiting gets the message
    with its properties and headers as AMQP 1.0 fields."""
    assert call(running, "PUT", "/queues/%2F/p-q", {}, user="alice")[0] == 201
    connection = BlockingConnection(
        running.url, timeout=10, user="alice", password=PASSWORD, allowed_mechs="PLAIN"
    )
    try:
        receiver = connection.create_receiver("/queues/p-q", credit=1)
        properties = {"content_type": "text/plain", "message_id": "m-1", "headers": {"n": 7}}
        status, body = _publish(running, "amq.default", "p-q", "hello", properties=properties)
        assert (status, body) == (200, {"routed": True})
        message = receiver.receive(timeout=10)
        receiver.accept()
    finally:
        connection.close()
    assert message.body == b"hello"
    assert (message.content_type, message.id) == ("text/plain", "m-1")
    headers: object = message.properties
    assert headers == {"n": 7}
    assert running.queue("p-q").ready == 0


def test_publish_through_an_exchange_and_base64(running: RunningServer) -> None:
    """A bound exchange routes by key; an unbound key or a missing queue answers routed
    false and creates nothing."""
    assert call(running, "PUT", "/queues/%2F/p-bound", {}, user="alice")[0] == 201
    binding = {"routing_key": "k"}
    assert call(running, "POST", "/bindings/%2F/e/amq.direct/q/p-bound", binding, user="alice")[
        0
    ] in (201, 204)
    payload = base64.b64encode(b"\x00\xffbin").decode()
    status, body = _publish(running, "amq.direct", "k", payload, payload_encoding="base64")
    assert (status, body) == (200, {"routed": True})
    assert running.queue("p-bound").ready == 1
    assert _publish(running, "amq.direct", "other", "x") == (200, {"routed": False})
    assert _publish(running, "amq.default", "p-missing", "x") == (200, {"routed": False})
    assert call(running, "GET", "/queues/%2F/p-missing", user="alice")[0] == 404
    assert _publish(running, "p-no-exchange", "k", "x")[0] == 404
    assert running.queue("p-bound").ready == 1


def test_bad_requests_are_refused_and_store_nothing(running: RunningServer) -> None:
    """Bad fields 400, a message over max_message_size 413, a body over the HTTP cap 413, no
    write permission 403, another vhost 404: the queue stays empty."""
    assert call(running, "PUT", "/queues/%2F/p-guard", {}, user="alice")[0] == 201
    for extra in (
        {"payload_encoding": "hex"},
        {"payload_encoding": "base64"},
        {"properties": {"priority": 1000}},
        {"properties": {"headers": {"h": {"nested": 1}}}},
        {"properties": {"expiration": "soon"}},
    ):
        assert _publish(running, "amq.default", "p-guard", "!!", **extra)[0] == 400
    status, body = _publish(running, "amq.default", "p-guard", "x" * (SMALL_MESSAGE_SIZE + 1))
    assert status == 413
    assert "max_message_size" in body["reason"]
    status, _ = _publish(running, "amq.default", "p-guard", "x" * (100 * 1024))
    assert status == 413
    path = "/exchanges/%2F/amq.default/publish"
    denied = {"routing_key": "p-guard", "payload": "x", "properties": {}}
    assert call(running, "POST", path, denied, user="bob")[0] == 403
    missing = call(running, "POST", "/exchanges/nowhere/amq.direct/publish", denied, user="alice")
    assert missing[0] == 404
    assert call(running, "GET", path, user="alice")[0] == 405
    assert running.queue("p-guard").ready == 0


def test_full_budget_answers_503_and_never_grows() -> None:
    """A fan-out's copies share their payload, counted once: 8 copies of 40 KB fit a 256 KiB
    budget (counted in full they did not, issue 31). Publishing until the budget is used: 503
    with the reason, a fan-out then stores no copy, and the bytes held never pass the budget."""
    running = start_server(memory_budget=SMALL_BUDGET)
    try:
        fanned = [f"p-fan-{index}" for index in range(FAN_OUT)]
        for name in fanned:
            assert call(running, "PUT", f"/queues/%2F/{name}", {})[0] == 201
            bind = f"/bindings/%2F/e/amq.fanout/q/{name}"
            assert call(running, "POST", bind, {"routing_key": ""})[0] == 201
        status, body = _publish(running, "amq.fanout", "", "x" * PAYLOAD_SIZE)
        assert status == 200
        assert all(running.queue(name).ready == 1 for name in fanned)
        assert call(running, "PUT", "/queues/%2F/p-full", {})[0] == 201
        statuses = []
        for _ in range(3 * SMALL_BUDGET // PAYLOAD_SIZE):
            status, body = _publish(running, "amq.default", "p-full", "x" * PAYLOAD_SIZE)
            statuses.append(status)
            if status == 503:
                assert "memory budget" in body["reason"]
        held = running.queue("p-full").ready_bytes
        status, body = _publish(running, "amq.fanout", "", "x" * PAYLOAD_SIZE)
        assert status == 503
        assert all(running.queue(name).ready == 1 for name in fanned)
    finally:
        running.stop()
    assert statuses.count(200) >= 1
    assert statuses[-1] == 503
    assert held <= SMALL_BUDGET


def test_durable_reply_waits_for_the_log() -> None:
    """A persistent message to a durable queue is answered only once the log's write is done:
    while the disk is held the reply does not come; released, it says routed."""
    holding = threading.Event()
    release = threading.Event()

    def hold(nbytes: int) -> None:
        if holding.is_set():
            release.wait(20)

    running = start_server(storage_fault=hold)
    try:
        assert call(running, "PUT", "/queues/%2F/p-durable", {"durable": True})[0] == 201
        holding.set()
        replies: list[tuple[int, Any]] = []
        sender = threading.Thread(
            target=lambda: replies.append(
                _publish(
                    running, "amq.default", "p-durable", "kept", properties={"delivery_mode": 2}
                )
            )
        )
        sender.start()
        wait_until(lambda: running.queue("p-durable").ready == 1)
        sender.join(1.0)
        assert replies == []
        release.set()
        sender.join(20)
        assert replies == [(200, {"routed": True})]
    finally:
        release.set()
        running.stop()


def test_each_http_connection_publishes_under_its_own_name_forgotten_as_it_closes(
    running: RunningServer,
) -> None:
    """Each HTTP connection is a publisher of its own to the workers that store its copies
    (session/remote_publishers.py): charged to the API as one, a light HTTP client was held
    with a heavy one. The API keeps one number per open connection that published, however
    many requests it makes, and forgets it as the connection closes."""
    api = running.server.http_api
    assert api is not None
    assert call(running, "PUT", "/queues/%2F/named-q", {}, user="alice")[0] == 201
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
    body = json.dumps({"properties": {}, "routing_key": "named-q", "payload": "n"})
    clients = [
        http.client.HTTPConnection("127.0.0.1", running.server.http_api_port, timeout=10)
        for _ in range(3)
    ]
    try:
        for client in clients:
            for _ in range(4):
                client.request("POST", "/api/exchanges/%2F/amq.default/publish", body, headers)
                response = client.getresponse()
                assert (response.status, json.loads(response.read())) == (200, {"routed": True})
        assert api.http_publishers == len(clients)
        clients.pop().close()
        wait_until(lambda: api.http_publishers == 2)
    finally:
        for client in clients:
            client.close()
    wait_until(lambda: api.http_publishers == 0)
    assert running.queue("named-q").ready == 12
