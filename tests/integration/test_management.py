"""The /management link pair at the AMQP level: reply shape, correlation, order, credit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Message
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.process import serving
from support.resident import rss

from sluicegate.clients.management import ManagementClient
from sluicegate.gateway.rules.management.requests import Caller, Request, Response

KiB: Final = 1024
MiB: Final = 1024 * KiB


def _request(
    message_id: str, method: str, path: str, body: dict[str, object] | None = None
) -> Message:
    return Message(id=message_id, subject=method, address=path, reply_to="$me", body=body)


def test_replies_carry_status_correlation_and_come_in_order(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        requests = connection.create_sender("/management", name="mgmt-pair")
        # Credit 0: the replies must wait for the client's credit, then come in request order,
        # pre-settled (the client never settles them).
        replies = connection.create_receiver("/management", name="mgmt-pair", credit=0)
        requests.send(_request("r1", "PUT", "/queues/mgmt-raw", {"durable": True}))
        requests.send(_request("r2", "GET", "/queues/mgmt-raw"))
        requests.send(_request("r3", "GET", "/queues/mgmt-missing"))
        requests.send(_request("r4", "DELETE", "/queues/mgmt-raw"))
        received = []
        for _ in range(4):
            replies.flow(1)
            received.append(replies.receive(timeout=30))
    finally:
        connection.close()
    assert [m.correlation_id for m in received] == ["r1", "r2", "r3", "r4"]
    assert [m.subject for m in received] == ["201", "200", "404", "200"]
    assert all(m.properties == {"http:response": "1.1"} for m in received)
    info = received[1].body
    assert isinstance(info, dict)
    assert (info["name"], info["message_count"]) == ("mgmt-raw", 0)
    error = received[2].body
    assert isinstance(error, str)
    assert "mgmt-missing" in error
    assert received[3].body == {"message_count": 0}


def test_a_request_without_method_or_path_is_400(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        requests = connection.create_sender("/management", name="mgmt-bad")
        replies = connection.create_receiver("/management", name="mgmt-bad", credit=1)
        requests.send(Message(id="bad", body={"no": "subject"}))
        reply = replies.receive(timeout=30)
    finally:
        connection.close()
    assert (reply.subject, reply.correlation_id) == ("400", "bad")


def test_an_exclusive_queue_is_deleted_with_its_connection(server: RunningServer) -> None:
    registry = server.server.registry
    owner = BlockingConnection(server.url)
    other = BlockingConnection(server.url)
    try:
        requests = owner.create_sender("/management", name="mgmt-excl")
        replies = owner.create_receiver("/management", name="mgmt-excl", credit=1)
        body = {"durable": False, "exclusive": True, "auto_delete": False, "arguments": {}}
        requests.send(_request("x1", "PUT", "/queues/mgmt-exclusive", body))
        assert replies.receive(timeout=30).subject == "201"
        # Another connection may not declare it as its own (RabbitMQ answers 400).
        other_requests = other.create_sender("/management", name="mgmt-excl-2")
        other_replies = other.create_receiver("/management", name="mgmt-excl-2", credit=1)
        other_requests.send(_request("x2", "PUT", "/queues/mgmt-exclusive", body))
        assert other_replies.receive(timeout=30).subject == "400"
    finally:
        owner.close()
    try:
        wait_until(lambda: server.call(lambda: registry.get("mgmt-exclusive")) is None)
    finally:
        other.close()


def test_replies_the_client_does_not_take_stop_the_requests(server: RunningServer) -> None:
    """Request credit counts waiting replies: a pair never holds more than 8 of them."""
    connection = BlockingConnection(server.url)
    try:
        requests = connection.create_sender("/management", name="mgmt-bound")
        replies = connection.create_receiver("/management", name="mgmt-bound", credit=0)
        for index in range(8):
            requests.send(_request(f"b{index}", "GET", "/queues/mgmt-none"))
        connection.wait(lambda: requests.link.credit == 0, timeout=30)
        # Nothing more is granted while the 8 replies wait.
        assert requests.link.credit == 0
        answers = []
        for _ in range(8):
            replies.flow(1)
            answers.append(replies.receive(timeout=30).correlation_id)
        connection.wait(lambda: requests.link.credit > 0, timeout=30)
    finally:
        connection.close()
    assert answers == [f"b{index}" for index in range(8)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ten_thousand_exchanges_and_bindings_are_listed_page_by_page(
    make_server: Callable[..., RunningServer],
) -> None:
    """Listings of 10,000 failed to encode in one reply (issue 17 §7); pages of 500 work."""
    running = make_server()
    registry = running.server.registry

    def declare() -> None:
        registry.declare_queue("bound", durable=False)
        for n in range(10_000):
            registry.declare_exchange(f"x{n:05d}", "direct", durable=False)
            registry.bind(f"x{n:05d}", "bound", "key")

    running.call(declare)
    exchanges = running.call(lambda: len(registry.exchanges()))  # with amq.direct and the rest
    with ManagementClient(running.url) as client:
        for path, total in (("/exchanges", exchanges), ("/bindings?dstq=bound", 10_000)):
            refused = client.request("GET", path)
            assert refused.status == 400
            seen: list[object] = []
            page, page_count, total_count = 1, 1, 0
            while page <= page_count:
                separator = "&" if "?" in path else "?"
                reply = client.request("GET", f"{path}{separator}page={page}&page_size=500")
                assert reply.status == 200
                assert isinstance(reply.body, dict)
                page_count = reply.body["page_count"]
                total_count = reply.body["total_count"]
                seen.extend(reply.body["items"])
                page += 1
            assert len(seen) == total == total_count


def _declare_wide_queues(running: RunningServer, count: int, argument_size: int) -> None:
    """Queues whose maps are wide: each lists an argument of ``argument_size`` characters."""

    def declare() -> None:
        for index in range(count):
            running.server.registry.declare_queue(
                f"wide-{index:04d}", {"x-wide": "w" * argument_size}, durable=False
            )

    running.call(declare)


def _waiting(running: RunningServer) -> tuple[list[int], int]:
    """Each connection's charge for its unsent deliveries and replies, and the server's."""
    broker = running.server.broker
    return running.call(
        lambda: ([state.waiting.bytes for state in broker.connections], broker.waiting.total)
    )


def test_replies_waiting_for_credit_are_charged_and_bounded_per_connection(
    make_server: Callable[..., RunningServer],
) -> None:
    """Issue 31: ten pairs sending eight listings each, never granting reply credit, made the
    server hold 829 MiB that nothing counted. Replies waiting are charged to their connection's
    unsent bytes at their encoded size; once those reach ``max_outgoing_pending_size`` further
    requests are answered 503, not carried out; the client gets every answer when it takes them."""
    limit = 1 * MiB
    running = make_server(max_outgoing_pending_size=limit)
    _declare_wide_queues(running, 300, 2000)
    connection = BlockingConnection(running.url, timeout=30)
    try:
        pairs = []
        for index in range(4):
            requests = connection.create_sender("/management", name=f"wide-{index}")
            replies = connection.create_receiver("/management", name=f"wide-{index}", credit=0)
            for number in range(8):
                requests.send(_request(f"{index}-{number}", "GET", "/queues"))
            pairs.append(replies)
        charged, total = _waiting(running)
        # All 32 answered and waiting: two listings (the second took it past its limit) and
        # 30 refusals of a few hundred bytes, each with its bookkeeping.
        assert len(charged) == 1
        assert limit <= charged[0] <= 2 * limit + 32 * KiB
        assert total == charged[0]
        # Meanwhile another client is served, listings included.
        with ManagementClient(running.url) as other:
            listed = other.request("GET", "/queues?page=1&page_size=10")
            assert listed.status == 200
        statuses: list[str] = []
        for replies in pairs:
            for _ in range(8):
                replies.flow(1)
                reply = replies.receive(timeout=30)
                statuses.append(reply.subject or "")
                if reply.subject == "503":
                    assert "max_outgoing_pending_size" in str(reply.body)
                else:
                    assert isinstance(reply.body, list)
                    assert len(reply.body) == 300
        assert statuses.count("200") == 2
        assert statuses.count("503") == 30
        # Taken and written, nothing is charged any more, and the next listing is served.
        wait_until(lambda: _waiting(running) == ([0], 0))
        requests = connection.create_sender("/management", name="wide-after")
        replies = connection.create_receiver("/management", name="wide-after", credit=1)
        requests.send(_request("after", "GET", "/queues"))
        assert replies.receive(timeout=30).subject == "200"
    finally:
        connection.close()
    wait_until(lambda: _waiting(running) == ([], 0))


def test_a_listing_larger_than_a_connection_may_hold_is_refused_before_it_is_built(
    make_server: Callable[..., RunningServer],
) -> None:
    """A reply is encoded with its size counted: one past ``max_outgoing_pending_size`` is
    answered 400, never held; smaller pages of the same listing are served."""
    running = make_server(max_outgoing_pending_size=256 * KiB)
    _declare_wide_queues(running, 300, 2000)
    with ManagementClient(running.url) as client:
        refused = client.request("GET", "/queues")
        assert refused.status == 400
        assert "smaller pages" in str(refused.body)
        page = client.request("GET", "/queues?page=2&page_size=50")
        assert page.status == 200
        assert isinstance(page.body, dict)
        assert len(page.body["items"]) == 50
    assert _waiting(running) == ([], 0)


def test_an_internal_error_in_one_request_is_answered_500_and_the_pair_carries_on(
    make_server: Callable[..., RunningServer],
) -> None:
    """A fault injected into the router (a bug's stand-in): the request gets 500, the link
    pair and the connection go on."""
    running = make_server()
    router = running.server.broker.management.routers[running.server.registry]

    def broken(request: Request, rest: list[str], caller: Caller) -> Response:
        raise RuntimeError("injected fault")

    running.call(lambda: router._routes.__setitem__("exchanges", broken))
    with ManagementClient(running.url) as client:
        failed = client.request("GET", "/exchanges")
        assert failed.status == 500
        assert "injected fault" in str(failed.body)
        assert client.request("PUT", "/queues/after-fault", {"durable": False}).status == 201


@pytest.mark.slow
def test_listings_never_taken_by_many_connections_keep_the_servers_rss_bounded() -> None:
    """Issue 31's attack on a server process: ten connections of four pairs send eight listings
    of some 650 KB each and never grant reply credit, 208 MB of replies before the bound. Each
    connection now holds two (the second took it past its 1 MiB), so RSS grows by some 13 MB."""
    with serving("--max-outgoing-pending-size", "1MiB") as (process, port):
        url = f"amqp://127.0.0.1:{port}"
        wide = {"durable": False, "arguments": {"x-wide": "w" * 2000}}
        with ManagementClient(url) as client:
            for index in range(300):
                assert client.request("PUT", f"/queues/wide-{index:04d}", wide).status == 201
        before = rss(process.pid)
        connections = [BlockingConnection(url, timeout=60) for _ in range(10)]
        try:
            for number, connection in enumerate(connections):
                for pair in range(4):
                    name = f"never-taken-{number}-{pair}"
                    requests = connection.create_sender("/management", name=name)
                    connection.create_receiver("/management", name=name, credit=0)
                    for request in range(8):
                        requests.send(_request(f"{pair}-{request}", "GET", "/queues"))
            growth = rss(process.pid) - before
            assert growth <= 48 * MiB, f"RSS grew {growth / MiB:.0f} MiB"
            # Another client is served meanwhile.
            with ManagementClient(url) as other:
                assert other.request("GET", "/queues/wide-0000").status == 200
        finally:
            for connection in connections:
                connection.close()
