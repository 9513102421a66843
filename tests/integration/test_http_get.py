"""RabbitMQ's ``POST /api/queues/{vhost}/{name}/get`` against a real server: messages looked at
stay in order and count as redelivered, ``ack_requeue_false`` removes them, the reply is bounded,
and the attacks (a huge count, no permission, a queue that does not exist, a stream) are refused."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote

import pytest
from integration.conftest import RunningServer, start_server
from integration.test_dynamic_and_cc import _Temporary
from integration.test_http_api import EVERYTHING, PASSWORD, call
from proton.utils import BlockingConnection
from support.clients import publish

from sluicegate.gateway.http.get_api import MAX_COUNT, MAX_REPLY_PAYLOAD
from sluicegate.gateway.rules.auth import User, hash_password, parse_users

# Large enough that a hundred of them overflow the reply's share of payload.
LARGE = 30_000


@functools.cache
def _users() -> dict[str, User]:
    hashed = hash_password(PASSWORD)
    return parse_users(
        {
            "alice": {"password_hash": hashed, "permissions": {"/": EVERYTHING}},
            "bob": {
                "password_hash": hashed,
                "permissions": {"/": {"configure": ".*", "write": ".*", "read": "^bob-"}},
            },
        }
    )


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    server = start_server(users=_users())
    yield server
    server.stop()


def _url(running: RunningServer) -> str:
    return f"amqp://alice:{PASSWORD}@127.0.0.1:{running.port}"


def _get(running: RunningServer, queue: str, user: str = "alice", **body: Any) -> tuple[int, Any]:
    body.setdefault("ackmode", "ack_requeue_true")
    body.setdefault("encoding", "auto")
    return call(running, "POST", f"/queues/%2F/{queue}/get", body, user=user)


def test_requeue_modes_leave_messages_in_order(running: RunningServer) -> None:
    """Two gets that requeue: the same first messages, in order, the queue's count unchanged
    (a release raises no delivery-count: not redelivered, as the classic queue counts a release
    over AMQP); then ack_requeue_false takes all three and empties it."""
    assert call(running, "PUT", "/queues/%2F/g-q", {}, user="alice")[0] == 201
    publish(_url(running), "/queues/g-q", [b"m0", b"m1", b"m2"])
    status, first = _get(running, "g-q", count=2)
    assert status == 200
    assert [m["payload"] for m in first] == ["m0", "m1"]
    assert [m["redelivered"] for m in first] == [False, False]
    assert [m["message_count"] for m in first] == [2, 1]
    assert first[0]["routing_key"] == "g-q"
    assert running.queue("g-q").ready == 3
    status, second = _get(running, "g-q", count=3, ackmode="reject_requeue_true")
    assert status == 200
    assert [m["payload"] for m in second] == ["m0", "m1", "m2"]
    assert [m["redelivered"] for m in second] == [False, False, False]
    assert running.queue("g-q").ready == 3
    status, taken = _get(running, "g-q", count=5, ackmode="ack_requeue_false")
    assert status == 200
    assert [m["payload"] for m in taken] == ["m0", "m1", "m2"]
    assert [m["message_count"] for m in taken] == [2, 1, 0]
    assert running.queue("g-q").ready == 0
    assert running.queue("g-q").unacked == 0
    assert _get(running, "g-q") == (200, [])


def test_encoding_truncate_and_the_reply_cap(running: RunningServer) -> None:
    """Binary payloads come as base64; truncate cuts the payload shown, not payload_bytes; a
    hundred large messages share the reply's cap on payload."""
    assert call(running, "PUT", "/queues/%2F/g-big", {"arguments": {}}, user="alice")[0] == 201
    publish(_url(running), "/queues/g-big", [b"\xff\x00" * 50] + [b"x" * LARGE] * (MAX_COUNT - 1))
    status, one = _get(running, "g-big", truncate=10)
    assert status == 200
    assert (one[0]["payload_encoding"], one[0]["payload_bytes"]) == ("base64", 100)
    assert one[0]["payload"] == "/wD/AP8A/wD/AA=="
    status, many = _get(running, "g-big", count=MAX_COUNT, encoding="base64")
    assert status == 200
    assert len(many) == MAX_COUNT
    assert all(m["payload_encoding"] == "base64" for m in many)
    assert many[1]["payload_bytes"] == LARGE
    shown = sum(len(m["payload"]) * 3 // 4 for m in many)
    assert shown <= MAX_REPLY_PAYLOAD + 3 * MAX_COUNT
    assert running.queue("g-big").ready == MAX_COUNT


def test_bad_gets_are_refused_and_take_nothing(running: RunningServer) -> None:
    """A count over the cap, a bad ackmode or encoding 400; no read permission 403; a queue
    that does not exist 404; a stream 400 as RabbitMQ answers; another connection's exclusive
    queue 400 as the management router answers: the queue keeps its message."""
    assert call(running, "PUT", "/queues/%2F/g-guard", {}, user="alice")[0] == 201
    publish(_url(running), "/queues/g-guard", [b"kept"])
    assert _get(running, "g-guard", count=MAX_COUNT + 1)[0] == 400
    assert _get(running, "g-guard", count=10**12)[0] == 400
    assert _get(running, "g-guard", ackmode="take_it_all")[0] == 400
    assert _get(running, "g-guard", encoding="hex")[0] == 400
    assert _get(running, "g-guard", user="bob", ackmode="ack_requeue_false")[0] == 403
    assert _get(running, "g-nowhere")[0] == 404
    stream = {"durable": True, "arguments": {"x-queue-type": "stream"}}
    assert call(running, "PUT", "/queues/%2F/g-stream", stream, user="alice")[0] == 201
    status, body = _get(running, "g-stream")
    assert status == 400
    assert "stream" in body["reason"]
    connection = BlockingConnection(
        running.url, timeout=10, user="alice", password=PASSWORD, allowed_mechs="PLAIN"
    )
    try:
        receiver = connection.create_receiver(None, dynamic=True, options=_Temporary())
        exclusive = unquote(str(receiver.link.remote_source.address).rsplit("/", 1)[-1])
        status, body = _get(running, quote(exclusive, safe=""))
    finally:
        connection.close()
    assert status == 400
    assert "exclusive access" in body["reason"]
    assert running.queue("g-guard").ready == 1


def test_a_quorum_queue_answers_as_a_classic_one(running: RunningServer) -> None:
    """RabbitMQ gets from quorum queues too: looked at, then redelivered (a quorum queue counts
    a requeue, as RabbitMQ 4's acquired count), then removed."""
    quorum = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
    assert call(running, "PUT", "/queues/%2F/g-quorum", quorum, user="alice")[0] == 201
    publish(_url(running), "/queues/g-quorum", [b"q0", b"q1"])
    status, looked = _get(running, "g-quorum", count=2)
    assert status == 200
    assert [m["payload"] for m in looked] == ["q0", "q1"]
    assert running.queue("g-quorum").ready == 2
    assert [m["redelivered"] for m in looked] == [False, False]
    status, taken = _get(running, "g-quorum", count=2, ackmode="ack_requeue_false")
    assert status == 200
    assert [m["payload"] for m in taken] == ["q0", "q1"]
    assert [m["redelivered"] for m in taken] == [True, True]
    assert running.queue("g-quorum").ready == 0


def test_gets_that_requeue_a_quorum_message_again_and_again_never_grow_it(
    running: RunningServer,
) -> None:
    """A hostile client repeats a requeueing get on one quorum message 200 times: each return
    stamps its acquired count (wire/redelivery_counts.py), replaced in place, so what the queue
    holds is the same after the second get as after the 200th, and one message is left."""
    running.call(
        # Each requeueing get counts against the delivery limit (20 by default), as RabbitMQ's
        # get is a basic.get and a requeueing reject.
        lambda: running.server.registry.declare_queue(
            "qq-requeued", {"x-queue-type": "quorum", "x-delivery-limit": 1_000}
        )
    )
    publish(_url(running), "/queues/qq-requeued", [b"once"])
    assert _get(running, "qq-requeued", count=1)[0] == 200
    assert _get(running, "qq-requeued", count=1)[0] == 200
    stamped = running.call(lambda: running.server.registry.held.total)
    for index in range(200):
        status, messages = _get(running, "qq-requeued", count=1)
        assert (index, status, len(messages)) == (index, 200, 1)
        assert messages[0]["payload"] == "once"
    assert running.call(lambda: running.server.registry.held.total) == stamped
    assert running.queue("qq-requeued").ready == 1
