"""The /management link pair at the AMQP level: reply shape, correlation, order, credit."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from integration.conftest import RunningServer
from proton import Message
from proton.utils import BlockingConnection
from support.polling import wait_until

from sluicegate.clients.management import ManagementClient


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
