"""The HTTP API the console reads (docs/http-api.md): sluicegate's loop snapshots under
``/api/sluicegate/``, connections paged, the console's files; over real HTTP against a real
server with real AMQP clients."""

from __future__ import annotations

import base64
import functools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest
from integration.conftest import RunningServer, start_server
from proton import Message
from proton.reactor import Container
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.prober import Prober

from sluicegate.gateway.http.loop_views import LINKS_PAGE
from sluicegate.gateway.rules.auth import User, hash_password, parse_users
from sluicegate.gateway.rules.vhosts import parse_vhosts

PASSWORD = "s3cret"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}


@functools.cache
def _users() -> dict[str, User]:
    hashed = hash_password(PASSWORD)
    return parse_users(
        {
            "root": {
                "password_hash": hashed,
                "tags": ["administrator"],
                "permissions": dict.fromkeys(("/", "tenant-b"), EVERYTHING),
            },
            "alice": {"password_hash": hashed, "permissions": {"/": EVERYTHING}},
            "bob": {"password_hash": hashed, "permissions": {"tenant-b": EVERYTHING}},
        }
    )


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(users=_users(), vhosts=parse_vhosts({"tenant-b": {}}))
    yield running
    running.stop()


def fetch(
    running: RunningServer, path: str, user: str | None = "root", method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """One request to the listener; status, headers, body."""
    url = f"http://127.0.0.1:{running.server.http_api_port}{path}"
    request = urllib.request.Request(url, method=method)
    if user is not None:
        token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def get(running: RunningServer, path: str, user: str = "root") -> Any:
    status, _, body = fetch(running, "/api" + path, user)
    assert status == 200, body
    return json.loads(body)


def _connection(running: RunningServer, container: str) -> str:
    wait_until(lambda: any(c["container_id"] == container for c in get(running, "/connections")))
    return str(
        next(c["name"] for c in get(running, "/connections") if c["container_id"] == container)
    )


def _open(running: RunningServer, user: str, container: str) -> BlockingConnection:
    url = f"amqp://{user}:{PASSWORD}@127.0.0.1:{running.port}"
    return BlockingConnection(url, container=Container(container_id=container))


def _heaviest(running: RunningServer, user: str) -> set[str]:
    return {q["name"] for q in get(running, "/sluicegate/budget", user)["queues"]}


def test_a_connections_loops_say_which_holds_each_link(server: RunningServer) -> None:
    """A consumer without credit is held by its link credit, one with credit on an empty queue
    by the queue; a publisher with credit flows; the connection's reads are not paused."""
    client = _open(server, "alice", "loops")
    try:
        client.create_receiver("loops-starved", credit=0)
        client.create_receiver("loops-empty", credit=10)
        client.create_sender("loops-empty")
        name = _connection(server, "loops")
        path = f"/sluicegate/connections/{quote(name, safe='')}"

        def settled() -> bool:
            loops = get(server, path)
            return len(loops["consumers"]) == 2 and len(loops["publishers"]) == 1

        wait_until(settled)

        # Snapshots live a second: wait for one taken after the credit requests went out.
        def waits_for_a_message() -> bool:
            held = {c["queue"]: c["held_by"] for c in get(server, path)["consumers"]}
            return (held.get("loops-empty") or "").startswith("queue: empty")

        wait_until(waits_for_a_message)
        loops = get(server, path)
    finally:
        client.close()
    assert (loops["user"], loops["vhost"], loops["reads_paused"]) == ("alice", "/", False)
    assert loops["paused_because"] == []
    consumers = {c["queue"]: c for c in loops["consumers"]}
    assert consumers["loops-starved"]["client_credit"] == 0
    assert consumers["loops-starved"]["held_by"].startswith("link credit")
    assert consumers["loops-empty"]["client_credit"] > 0
    assert consumers["loops-empty"]["queue_credit"] > 0
    (publisher,) = loops["publishers"]
    assert publisher["target"] == "loops-empty"
    assert publisher["credit"] > 0
    assert publisher["held_by"] is None
    assert loops["session_count"] == len(loops["sessions"]) >= 1
    assert {"bytes_pending", "frames_pending", "bytes_written"} <= set(loops["writer"])
    assert {"debt", "limit", "paused"} <= set(loops["account"])
    assert loops["budget"]["blocked"] is False


def test_links_come_a_page_at_a_time(server: RunningServer) -> None:
    """A connection with more consumers than a page: each reply holds one page of them."""
    count = LINKS_PAGE + 20
    client = _open(server, "alice", "paged-links")
    try:
        for i in range(count):
            client.create_receiver(f"paged-{i:03d}", credit=0)
        name = _connection(server, "paged-links")
        path = f"/sluicegate/connections/{quote(name, safe='')}"
        wait_until(lambda: get(server, path)["consumer_count"] == count)
        first = get(server, path)
        second = get(server, path + "?page=2")
    finally:
        client.close()
    assert (first["page"], first["page_size"], len(first["consumers"])) == (1, LINKS_PAGE, 100)
    assert (second["page"], len(second["consumers"])) == (2, 20)
    names = {c["queue"] for c in first["consumers"]} | {c["queue"] for c in second["consumers"]}
    assert names == {f"paged-{i:03d}" for i in range(count)}


@pytest.mark.slow
def test_asking_for_ever_new_snapshots_leaves_amqp_clients_served(server: RunningServer) -> None:
    """Eight viewers ask for 200 snapshots nobody asked for before (every page of a connection
    with two pages of links, and names of no connection), each a reactor read past the cache:
    every request is answered, the answers stay right, and a prober is served throughout."""
    client = _open(server, "alice", "snapshot-attack")
    try:
        for i in range(LINKS_PAGE + 1):
            client.create_receiver(f"attack-{i:03d}", credit=0)
        name = quote(_connection(server, "snapshot-attack"), safe="")
        paths = [f"/api/sluicegate/connections/{name}?page={page}" for page in range(1, 101)]
        paths += [f"/api/sluicegate/connections/nobody-{i}" for i in range(100)]
        with Prober(f"amqp://alice:{PASSWORD}@127.0.0.1:{server.port}") as prober:
            prober.wait_rounds(1, timeout=30)
            with ThreadPoolExecutor(8) as viewers:
                statuses = list(viewers.map(lambda path: fetch(server, path)[0], paths))
            rounds = len(prober.seen.rounds)
            prober.wait_rounds(rounds + 2, timeout=30)
        assert statuses == [200] * 100 + [404] * 100
        assert prober.seen.failures == []
        assert len(prober.seen.rounds) >= rounds + 2
        assert get(server, f"/sluicegate/connections/{name}?page=2")["consumers"][0]["queue"] == (
            f"attack-{LINKS_PAGE:03d}"
        )
    finally:
        client.close()


def test_users_see_only_their_connections_and_vhosts(server: RunningServer) -> None:
    """alice gets 404 for root's connection; bob's budget view leaves out the queues and
    connections of the vhosts he cannot enter; root sees them."""
    roots = _open(server, "root", "roots")
    alices = _open(server, "alice", "alices")
    try:
        sender = alices.create_sender("visible-q")
        sender.send(Message(body=b"x" * 1000))
        name = _connection(server, "roots")
        status, _, _ = fetch(server, f"/api/sluicegate/connections/{quote(name, safe='')}", "alice")
        assert status == 404
        wait_until(
            lambda: any(
                q["name"] == "visible-q" for q in get(server, "/sluicegate/budget")["queues"]
            )
        )
        bobs = get(server, "/sluicegate/budget", "bob")
        alice_view = get(server, "/sluicegate/budget", "alice")
    finally:
        roots.close()
        alices.close()
    assert bobs["queues"] == []
    assert all(c["user"] == "alice" for c in alice_view["connections"])
    assert any(q["name"] == "visible-q" for q in alice_view["queues"])
    assert bobs["limit"] == alice_view["limit"] > 0


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [
        ("/api/sluicegate/connections/x?page=0", "GET", 400),
        ("/api/sluicegate/connections/x?page=abc", "GET", 400),
        ("/api/sluicegate/connections/x?page=" + "9" * 5000, "GET", 400),
        ("/api/sluicegate/connections/nobody", "GET", 404),
        ("/api/sluicegate/budget", "POST", 405),
        ("/api/sluicegate/nothing", "GET", 404),
        ("/api/connections?page=1&page_size=0", "GET", 400),
        ("/api/connections?page=x", "GET", 400),
    ],
)
def test_bad_requests_get_rabbitmqs_json_errors(
    server: RunningServer, path: str, method: str, status: int
) -> None:
    got, _, body = fetch(server, path, method=method)
    assert got == status
    assert set(json.loads(body)) == {"error", "reason"}


def test_without_credentials_the_loops_answer_401(server: RunningServer) -> None:
    status, headers, _ = fetch(server, "/api/sluicegate/budget", user=None)
    assert status == 401
    assert "WWW-Authenticate" in headers


def test_connections_page_as_rabbitmqs_do(server: RunningServer) -> None:
    clients = [_open(server, "alice", f"page-{i}") for i in range(3)]
    try:
        for i in range(3):
            _connection(server, f"page-{i}")
        paged = get(server, "/connections?page=2&page_size=2")
        everything = get(server, "/connections")
    finally:
        for client in clients:
            client.close()
    total = len(everything)
    assert total >= 3
    assert paged["page"] == 2
    assert paged["page_size"] == 2
    assert paged["total_count"] == total
    assert paged["page_count"] == -(-total // 2)
    assert [c["name"] for c in paged["items"]] == [c["name"] for c in everything[2:4]]


def test_the_console_files_are_served_and_nothing_else(server: RunningServer) -> None:
    status, headers, body = fetch(server, "/", user=None)
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert b'src="/console/app.js"' in body
    status, headers, body = fetch(server, "/console/vendor/uPlot.esm.js", user=None)
    assert status == 200
    assert headers["Content-Type"].startswith("text/javascript")
    assert b"export { uPlot as default }" in body
    status, _, body = fetch(server, "/console/vendor/uPlot.LICENSE", user=None)
    assert (status, body.startswith(b"The MIT License")) == (200, True)
    for path in ("/console/../pyproject.toml", "/etc/passwd", "/console/", "/console/nope.js"):
        assert fetch(server, path, user=None)[0] == 404
    assert fetch(server, "/", user=None, method="POST")[0] == 405


def test_the_node_in_rabbitmqs_shape_for_administrators(server: RunningServer) -> None:
    """``/api/nodes``: resident memory, the budget as the memory watermark, descriptors, free
    disk and the log's figures; 403 for a user without the administrator tag."""
    (node,) = get(server, "/nodes")
    assert get(server, f"/nodes/{quote(node['name'], safe='')}")["name"] == node["name"]
    assert node["running"] is True
    assert node["mem_used"] > 10 * 1024 * 1024
    assert node["mem_limit"] == node["sluicegate_budget"]["limit"] > 0
    assert node["mem_alarm"] is False
    assert 0 < node["fd_used"] < 1024
    assert node["disk_free"] > 0
    assert {"fsyncs", "bytes_written", "failing"} <= set(node["sluicegate_log"])
    assert fetch(server, "/api/nodes", "alice")[0] == 403
    assert fetch(server, "/api/nodes/elsewhere")[0] == 404
