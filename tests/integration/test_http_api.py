"""RabbitMQ's HTTP API over real HTTP (urllib) against a real server: shapes, status codes,
basic auth and permissions, and JSON errors for bad input."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from integration.conftest import RunningServer, start_server
from proton import Message
from proton.utils import BlockingConnection
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.identity import PRODUCT, RABBITMQ_VERSION, VERSION
from sluicegate.gateway.rules.auth import User, hash_password, parse_users
from sluicegate.gateway.rules.management.listing import MAX_PAGE_SIZE, MAX_UNPAGED
from sluicegate.gateway.rules.vhosts import parse_vhosts

PASSWORD = "s3cret"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}


def call(
    running: RunningServer,
    method: str,
    path: str,
    body: object = None,
    user: str | None = None,
    password: str = PASSWORD,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """One request; the status and the decoded JSON body (None when empty)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(running.api_url + path, data=data, method=method)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    return status, json.loads(text) if text else None


def _connections(running: RunningServer) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = call(running, "GET", "/connections")[1]
    return listed


@pytest.fixture(scope="module")
def anonymous() -> Iterator[RunningServer]:
    """A server without users: the loopback API needs no credentials, as ``guest`` does."""
    running = start_server()
    yield running
    running.stop()


@functools.cache
def _users() -> dict[str, User]:
    hashed = hash_password(PASSWORD)
    return parse_users(
        {
            "alice": {"password_hash": hashed, "permissions": {"/": EVERYTHING}},
            "root": {"password_hash": hashed, "tags": ["administrator"], **EVERYTHING},
            "bob": {
                "password_hash": hashed,
                "permissions": {
                    "tenant-b": EVERYTHING,
                    "/": {"configure": "^bob-", "write": "^bob-", "read": "^bob-"},
                },
            },
        }
    )


@pytest.fixture(scope="module")
def tenants() -> Iterator[RunningServer]:
    running = start_server(users=_users(), vhosts=parse_vhosts({"tenant-b": {}}))
    yield running
    running.stop()


def test_queue_routes_in_rabbitmq_shapes(anonymous: RunningServer) -> None:
    """PUT 201 then 204, GET with RabbitMQ's counts, listings per vhost, purge, DELETE 204."""
    arguments = {"x-queue-type": "quorum"}
    status, _ = call(anonymous, "PUT", "/queues/%2F/h-q", {"durable": True, "arguments": arguments})
    assert status == 201
    assert call(anonymous, "PUT", "/queues/%2F/h-q", {"arguments": arguments})[0] == 204
    publish(anonymous.url, "/queues/h-q", [b"12345"] * 3)
    connection = BlockingConnection(anonymous.url)
    try:
        connection.create_receiver("/queues/h-q", credit=1)
        wait_until(lambda: anonymous.queue("h-q").unacked == 1)
        status, queue = call(anonymous, "GET", "/queues/%2F/h-q")
    finally:
        connection.close()
    assert status == 200
    assert queue["name"] == "h-q"
    assert queue["vhost"] == "/"
    assert queue["type"] == "quorum"
    assert queue["durable"] is True
    assert queue["arguments"] == arguments
    assert (queue["messages"], queue["messages_ready"], queue["messages_unacknowledged"]) == (
        3,
        2,
        1,
    )
    assert queue["consumers"] == 1
    assert queue["state"] == "running"
    for path in ("/queues", "/queues/%2F"):
        status, listed = call(anonymous, "GET", path)
        assert status == 200
        assert [q["name"] for q in listed if q["name"] == "h-q"] == ["h-q"]
    status, page = call(anonymous, "GET", "/queues/%2F?page=1&page_size=1")
    assert status == 200
    assert page["page_size"] == 1
    assert len(page["items"]) == 1
    assert call(anonymous, "DELETE", "/queues/%2F/h-q/contents")[0] == 204
    wait_until(lambda: anonymous.queue("h-q").ready == 0)
    assert call(anonymous, "DELETE", "/queues/%2F/h-q")[0] == 204
    assert call(anonymous, "GET", "/queues/%2F/h-q")[0] == 404
    assert call(anonymous, "DELETE", "/queues/%2F/h-q")[0] == 404


def test_exchanges_and_bindings(anonymous: RunningServer) -> None:
    """Declare an exchange, bind a queue, list, route a message through it, unbind, delete."""
    assert call(anonymous, "PUT", "/queues/%2F/h-bound", {})[0] == 201
    assert call(anonymous, "PUT", "/exchanges/%2F/h-x", {"type": "direct"})[0] == 201
    assert call(anonymous, "PUT", "/exchanges/%2F/h-x", {"type": "direct"})[0] == 204
    status, exchange = call(anonymous, "GET", "/exchanges/%2F/h-x")
    assert status == 200
    assert (exchange["name"], exchange["type"], exchange["vhost"]) == ("h-x", "direct", "/")
    assert any(x["name"] == "h-x" for x in call(anonymous, "GET", "/exchanges/%2F")[1])
    status, _ = call(anonymous, "POST", "/bindings/%2F/e/h-x/q/h-bound", {"routing_key": "k"})
    assert status == 201
    status, bindings = call(anonymous, "GET", "/bindings/%2F/e/h-x/q/h-bound")
    assert status == 200
    assert bindings == [
        {
            "source": "h-x",
            "vhost": "/",
            "destination": "h-bound",
            "destination_type": "queue",
            "routing_key": "k",
            "arguments": {},
            "properties_key": "k",
        }
    ]
    publish(anonymous.url, "/exchanges/h-x/k", [b"routed"])
    wait_until(lambda: anonymous.queue("h-bound").ready == 1)
    assert call(anonymous, "DELETE", "/bindings/%2F/e/h-x/q/h-bound/k")[0] == 204
    assert call(anonymous, "GET", "/bindings/%2F/e/h-x/q/h-bound")[1] == []
    assert call(anonymous, "DELETE", "/bindings/%2F/e/h-x/q/h-bound/k")[0] == 404
    assert call(anonymous, "DELETE", "/exchanges/%2F/h-x")[0] == 204
    assert call(anonymous, "GET", "/exchanges/%2F/h-x")[0] == 404
    status, default = call(anonymous, "GET", "/exchanges/%2F/amq.default")
    assert (status, default["name"], default["type"]) == (200, "", "direct")


def test_connections_are_listed_and_closed_by_name(anonymous: RunningServer) -> None:
    """The JS client's test setup: find a connection by its container id, delete it by name."""
    connection = BlockingConnection(anonymous.url, container_id="h-container")
    try:
        status, listed = call(anonymous, "GET", "/connections")
        assert status == 200
        mine = [c for c in listed if c["container_id"] == "h-container"]
        assert len(mine) == 1
        assert mine[0]["user"] == "anonymous"
        assert mine[0]["vhost"] == "/"
        assert " -> 127.0.0.1:" in mine[0]["name"]
        assert isinstance(mine[0]["client_properties"], dict)
        name = quote(mine[0]["name"], safe="")
        assert call(anonymous, "GET", f"/connections/{name}")[0] == 200
        assert call(anonymous, "DELETE", f"/connections/{name}")[0] == 204
        wait_until(lambda: not any(c["name"] == mine[0]["name"] for c in _connections(anonymous)))
        assert call(anonymous, "DELETE", f"/connections/{name}")[0] == 404
    finally:
        # Closed by the server: proton reports connection-forced.
        with contextlib.suppress(Exception):
            connection.close()


def test_overview_vhosts_users_permissions(anonymous: RunningServer) -> None:
    status, overview = call(anonymous, "GET", "/overview")
    assert status == 200
    # The RabbitMQ version the OPEN frame advertises, and sluicegate's own.
    assert overview["rabbitmq_version"] == overview["management_version"] == RABBITMQ_VERSION
    assert (overview["product_name"], overview["product_version"]) == (PRODUCT, VERSION)
    assert {"queues", "connections", "exchanges", "consumers"} <= set(overview["object_totals"])
    assert {"messages", "messages_ready"} <= set(overview["queue_totals"])
    assert call(anonymous, "GET", "/vhosts")[1][0]["name"] == "/"
    assert call(anonymous, "GET", "/vhosts/%2F")[0] == 200
    assert call(anonymous, "GET", "/vhosts/nowhere")[0] == 404
    assert call(anonymous, "GET", "/whoami")[1]["name"] == "anonymous"
    assert call(anonymous, "GET", "/users")[0] == 200
    assert call(anonymous, "GET", "/permissions/%2F/anonymous")[1]["configure"] == ".*"


@pytest.mark.parametrize(
    ("method", "path", "raw", "status", "error"),
    [
        ("PUT", "/queues/%2F/h-bad", b"{not json", 400, "bad_request"),
        ("PUT", "/queues/%2F/h-bad", b"[1, 2]", 400, "bad_request"),
        ("PUT", "/queues/%2F/h-bad", b'{"durable": "yes"}', 400, "bad_request"),
        ("PUT", "/queues/%2F/h-x", b'{"arguments": {"x-queue-type": "x"}}', 501, "not_implemented"),
        ("PUT", "/queues/%2F/amq.h-bad", b"{}", 403, "not_authorised"),
        ("PUT", "/exchanges/%2F/h-bad", b'{"type": 7}', 400, "bad_request"),
        ("PUT", "/exchanges/%2F/amq.direct", b'{"type": "direct"}', 403, "not_authorised"),
        ("GET", "/queues/nowhere/h-bad", None, 404, "Object Not Found"),
        ("GET", "/no-such-route", None, 404, "Object Not Found"),
        ("PATCH", "/queues/%2F/h-bad", None, 405, "Method Not Allowed"),
        ("POST", "/bindings/%2F/e/no-x/q/no-q", b"{}", 404, "Object Not Found"),
    ],
)
def test_bad_input_gets_rabbitmqs_json_errors(
    anonymous: RunningServer,
    method: str,
    path: str,
    raw: bytes | None,
    status: int,
    error: str | None,
) -> None:
    got, body = call(anonymous, method, path, raw=raw)
    assert got == status, body
    assert isinstance(body["reason"], str)
    assert body["reason"]
    if error is not None:
        assert body["error"] == error


def test_a_body_over_the_size_limit_is_refused(make_server: Any) -> None:
    running = make_server(http_max_request_size=1024)
    got, body = call(running, "PUT", "/queues/%2F/h-big", raw=b" " * 2048)
    assert got == 413
    assert body["error"] == "request_too_large"


def test_basic_auth(tenants: RunningServer) -> None:
    """No credentials or a wrong password: 401 with RabbitMQ's body; right ones: served."""
    status, body = call(tenants, "GET", "/queues")
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Login failed"})
    assert call(tenants, "GET", "/queues", user="alice", password="wrong")[0] == 401
    assert call(tenants, "GET", "/queues", user="nobody")[0] == 401
    assert call(tenants, "GET", "/queues", user="alice")[0] == 200
    assert call(tenants, "GET", "/whoami", user="alice")[1]["name"] == "alice"


def test_a_user_sees_and_changes_only_its_vhosts_and_names(tenants: RunningServer) -> None:
    assert call(tenants, "PUT", "/queues/%2F/alice-q", {}, user="alice")[0] == 201
    assert call(tenants, "PUT", "/queues/tenant-b/bob-b", {}, user="bob")[0] == 201
    # alice has no permissions in tenant-b: RabbitMQ's 401 for a vhost the user may not enter.
    assert call(tenants, "GET", "/queues/tenant-b", user="alice")[0] == 401
    assert call(tenants, "PUT", "/queues/tenant-b/alice-b", {}, user="alice")[0] == 401
    assert [v["name"] for v in call(tenants, "GET", "/vhosts", user="alice")[1]] == ["/"]
    assert [v["name"] for v in call(tenants, "GET", "/vhosts", user="bob")[1]] == ["/", "tenant-b"]
    # bob may configure only bob-* in "/": alice's queue is neither listed nor deletable.
    listed = call(tenants, "GET", "/queues", user="bob")[1]
    assert {(q["vhost"], q["name"]) for q in listed} == {("tenant-b", "bob-b")}
    status, body = call(tenants, "DELETE", "/queues/%2F/alice-q", user="bob")
    assert status == 403
    assert "configure" in body["reason"]
    assert call(tenants, "PUT", "/queues/%2F/bob-mine", {}, user="bob")[0] == 201
    assert [u["name"] for u in call(tenants, "GET", "/users", user="bob")[1]] == ["bob"]
    assert call(tenants, "GET", "/permissions/%2F/alice", user="bob")[0] == 404
    assert call(tenants, "GET", "/permissions/%2F/bob", user="bob")[1]["read"] == "^bob-"


def test_a_user_sees_and_closes_only_its_own_connections(tenants: RunningServer) -> None:
    def connect(user: str, container: str) -> BlockingConnection:
        return BlockingConnection(
            tenants.url,
            timeout=10,
            user=user,
            password=PASSWORD,
            allowed_mechs="PLAIN",
            container_id=container,
        )

    alices, bobs = connect("alice", "h-alice"), connect("bob", "h-bob")
    try:
        seen = call(tenants, "GET", "/connections", user="bob")[1]
        assert [c["container_id"] for c in seen] == ["h-bob"]
        assert seen[0]["user"] == "bob"
        alice_name = call(tenants, "GET", "/connections", user="alice")[1][0]["name"]
        quoted = quote(alice_name, safe="")
        assert call(tenants, "DELETE", f"/connections/{quoted}", user="bob")[0] == 404
        sender = alices.create_sender("/queues/alice-q")
        sender.send(Message(body="still open"))
        wait_until(lambda: tenants.queue("alice-q").ready == 1)
    finally:
        alices.close()
        bobs.close()


def _containers(running: RunningServer, user: str) -> set[str]:
    listed: list[dict[str, str]] = call(running, "GET", "/connections", user=user)[1]
    return {connection["container_id"] for connection in listed}


def test_an_administrator_sees_and_closes_every_connection(tenants: RunningServer) -> None:
    """RabbitMQ's administrator tag: its clients' test helpers drop other users' connections."""
    bobs = BlockingConnection(
        tenants.url,
        timeout=10,
        user="bob",
        password=PASSWORD,
        allowed_mechs="PLAIN",
        container_id="h-bob-2",
    )
    try:
        assert call(tenants, "GET", "/whoami", user="root")[1]["tags"] == ["administrator"]
        users = {u["name"] for u in call(tenants, "GET", "/users", user="root")[1]}
        assert users == {"alice", "bob", "root"}
        seen = call(tenants, "GET", "/connections", user="root")[1]
        bob = [c for c in seen if c["container_id"] == "h-bob-2"]
        assert [c["user"] for c in bob] == ["bob"]
        quoted = quote(bob[0]["name"], safe="")
        assert call(tenants, "DELETE", f"/connections/{quoted}", user="root")[0] == 204
        wait_until(lambda: not _containers(tenants, "root") & {"h-bob-2"})
    finally:
        bobs.close()


def test_the_api_can_be_turned_off(make_server: Any) -> None:
    running = make_server(http_api_listen="off")
    assert running.server.http_api_port == 0


def test_vhosts_created_at_run_time_persist_across_a_restart(tmp_path: Path) -> None:
    """PUT /api/vhosts/{name}: 201 then 204; AMQP clients enter it; its durable queue and the
    vhost itself are there after a restart; DELETE closes its connections and removes it."""
    running = start_server(data_dir=tmp_path)
    try:
        assert call(running, "PUT", "/vhosts/h-live", {"description": "ignored"})[0] == 201
        assert call(running, "PUT", "/vhosts/h-live", {})[0] == 204
        assert call(running, "PUT", "/queues/h-live/kept", {"durable": True})[0] == 201
        connection = BlockingConnection(running.url, timeout=10, virtual_host="vhost:h-live")
        try:
            sender = connection.create_sender("/queues/kept")
            sender.send(Message(body="survives", durable=True))
        finally:
            connection.close()
        assert call(running, "GET", "/queues/h-live/kept")[1]["messages"] == 1
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        assert "h-live" in [v["name"] for v in call(running, "GET", "/vhosts")[1]]
        assert call(running, "GET", "/queues/h-live/kept")[1]["messages"] == 1
        held = BlockingConnection(running.url, timeout=10, virtual_host="vhost:h-live")
        wait_until(lambda: any(c["vhost"] == "h-live" for c in _connections(running)))
        assert call(running, "DELETE", "/vhosts/h-live")[0] == 204
        assert not any(c["vhost"] == "h-live" for c in _connections(running))
        with contextlib.suppress(Exception):
            held.close()  # closed by the server: connection-forced
        assert call(running, "GET", "/vhosts/h-live")[0] == 404
        assert call(running, "DELETE", "/vhosts/h-live")[0] == 404
        # The default and configured virtual hosts stay.
        assert call(running, "DELETE", "/vhosts/%2F")[0] == 403
    finally:
        running.stop()
    running = start_server(data_dir=tmp_path)
    try:
        assert [v["name"] for v in call(running, "GET", "/vhosts")[1]] == ["/"]
    finally:
        running.stop()


def test_only_an_administrator_creates_vhosts(tenants: RunningServer) -> None:
    status, body = call(tenants, "PUT", "/vhosts/h-not-mine", {}, user="alice")
    assert status == 403
    assert "administrator" in body["reason"]
    assert call(tenants, "GET", "/vhosts/h-not-mine", user="alice")[0] == 404


def test_a_closed_connection_gets_connection_forced_with_the_x_reason(
    anonymous: RunningServer,
) -> None:
    with RawClient.connect("127.0.0.1", anonymous.port, container_id="h-raw") as client:
        wait_until(lambda: any(c["container_id"] == "h-raw" for c in _connections(anonymous)))
        name = next(c["name"] for c in _connections(anonymous) if c["container_id"] == "h-raw")
        request = urllib.request.Request(
            f"{anonymous.api_url}/connections/{quote(name, safe='')}",
            method="DELETE",
            headers={"X-Reason": "maintenance window"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204
        close = client.wait_for("close", timeout=10)
    assert close["error"]["condition"] == "amqp:connection:forced"
    assert close["error"]["description"] == "Connection forced: maintenance window"


def test_users_and_permissions_are_read_only(anonymous: RunningServer) -> None:
    for path in ("/users/carol", "/permissions/%2F/carol"):
        status, body = call(anonymous, "PUT", path, {"password": "x"})
        assert status == 405
        assert "configuration file" in body["reason"]


def test_a_listing_over_every_vhost_is_capped_and_pages_are_per_vhost(make_server: Any) -> None:
    """More queues than one reply may hold: /api/queues is refused (400, saying to ask for
    pages), and /api/queues/{vhost} gives them page by page."""
    running = make_server(vhosts=parse_vhosts({"h-other": {}}))

    def declare() -> None:
        for index in range(MAX_UNPAGED + 1):
            running.server.registry.declare_queue(f"h-many-{index:05}", {})

    running.call(declare)
    status, body = call(running, "GET", "/queues")
    assert status == 400
    assert "page" in body["reason"]
    status, page = call(running, "GET", f"/queues/%2F?page=5&page_size={MAX_PAGE_SIZE}")
    assert status == 200
    assert page["total_count"] == MAX_UNPAGED + 1
    assert [q["name"] for q in page["items"]] == [f"h-many-{MAX_UNPAGED:05}"]
    assert call(running, "GET", "/queues?page=1")[0] == 400


def test_without_users_anonymous_login_off_closes_the_api(make_server: Any) -> None:
    """Anonymous access follows ``anonymous_login`` for the API's own address (loopback here),
    as it does for AMQP."""
    running = make_server(anonymous_login="off")
    assert call(running, "GET", "/overview")[0] == 401
    assert call(running, "GET", "/overview", user="guest", password="guest")[0] == 401
