"""Headers exchanges and exchange-to-exchange bindings over a real server, set up with RabbitMQ's
own AMQP 1.0 client (rabbitmq-amqp-python-client) and used by proton publishers and consumers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.conftest import RunningServer, start_server
from proton import Message
from rabbitmq_amqp_python_client import (
    AddressHelper,
    ClassicQueueSpecification,
    Connection,
    Environment,
    ExchangeSpecification,
    ExchangeToExchangeBindingSpecification,
    ExchangeToQueueBindingSpecification,
    ExchangeType,
    Management,
    OutcomeState,
    ValidationCodeException,
)
from rabbitmq_amqp_python_client import Message as ClientMessage
from rabbitmq_amqp_python_client.qpid.proton.utils import SendException
from support.clients import consume, publish
from support.raw_client import RawClient


@pytest.fixture
def connection(server: RunningServer) -> Iterator[Connection]:
    with _connected(server) as connection:
        yield connection


@contextlib.contextmanager
def _connected(server: RunningServer) -> Iterator[Connection]:
    """A dialled client connection, closed with its environment."""
    environment = Environment(f"amqp://127.0.0.1:{server.port}/")
    connection = environment.connection()
    connection.dial()
    try:
        yield connection
    finally:
        connection.close()
        environment.close()


def _bind_with_arguments(
    management: Management, source: str, queue: str, arguments: dict[str, object]
) -> None:
    """POST /bindings with arguments (the client's bind() always sends an empty map)."""
    body = {
        "source": source,
        "destination_queue": queue,
        "binding_key": "",
        "arguments": arguments,
    }
    management.request(body, "/bindings", "POST", [204])


def _listed(management: Management, query: str) -> list[dict[str, object]]:
    body: object = management.request(None, f"/bindings?{query}", "GET", [200]).body
    assert isinstance(body, list)
    return body


def _with_properties(body: str, **properties: object) -> Message:
    return Message(body=body, properties=properties)


def test_a_headers_exchange_routes_by_application_properties(
    connection: Connection, server: RunningServer
) -> None:
    management = connection.management()
    management.declare_exchange(
        ExchangeSpecification(name="it-headers", exchange_type=ExchangeType.headers)
    )
    for name in ("it-eu-orders", "it-urgent"):
        management.declare_queue(ClassicQueueSpecification(name=name))
    _bind_with_arguments(
        management,
        "it-headers",
        "it-eu-orders",
        {"x-match": "all", "region": "eu", "kind": "order"},
    )
    _bind_with_arguments(
        management, "it-headers", "it-urgent", {"x-match": "any", "urgent": True, "priority": 9}
    )
    messages = [
        _with_properties("eu-order", region="eu", kind="order"),
        _with_properties("eu-refund", region="eu", kind="refund"),
        _with_properties("urgent", urgent=True),
        _with_properties("both", region="eu", kind="order", priority=9),
        # An integer is not a boolean: no binding takes it.
        _with_properties("one-not-true", urgent=1),
        # The routing key plays no part.
        Message(body="no-properties", subject="eu.order"),
    ]
    outcomes = publish(server.url, "/exchanges/it-headers", messages=messages).outcomes
    assert outcomes == ["accepted", "released", "accepted", "accepted", "released", "released"]
    assert consume(server.url, "/queues/it-eu-orders", 2).bodies == ["eu-order", "both"]
    assert consume(server.url, "/queues/it-urgent", 2).bodies == ["urgent", "both"]

    # The listed binding's location is the path that deletes it, with the client's unbind().
    [listed] = _listed(management, "src=it-headers&dstq=it-urgent&key=")
    assert listed["arguments"] == {"x-match": "any", "urgent": True, "priority": 9}
    location = listed["location"]
    assert isinstance(location, str)
    management.unbind(location)
    assert _listed(management, "src=it-headers&dstq=it-urgent&key=") == []
    assert publish(
        server.url, "/exchanges/it-headers", messages=[_with_properties("late", urgent=True)]
    ).outcomes == ["released"]
    management.delete_exchange("it-headers")
    management.close()


def test_a_bad_x_match_is_refused(connection: Connection) -> None:
    management = connection.management()
    management.declare_queue(ClassicQueueSpecification(name="it-bad-match"))
    body = {
        "source": "amq.headers",
        "destination_queue": "it-bad-match",
        "binding_key": "",
        "arguments": {"x-match": "most"},
    }
    # The client reports 409 as RabbitMQ's precondition failure.
    with pytest.raises(ValidationCodeException, match="ErrPreconditionFailed"):
        management.request(body, "/bindings", "POST", [204])
    assert _listed(management, "src=amq.headers&dstq=it-bad-match") == []
    management.close()


def test_exchange_to_exchange_bindings_with_a_cycle(
    connection: Connection, server: RunningServer
) -> None:
    management = connection.management()
    declared = {"it-entry": ExchangeType.topic, "it-fan": ExchangeType.fanout}
    declared["it-loop"] = ExchangeType.direct
    for name, kind in declared.items():
        management.declare_exchange(ExchangeSpecification(name=name, exchange_type=kind))
    for name in ("it-e2e-a", "it-e2e-b"):
        management.declare_queue(ClassicQueueSpecification(name=name))
    entry_to_fan = ExchangeToExchangeBindingSpecification("it-entry", "it-fan", "orders.*")
    management.bind(entry_to_fan)
    management.bind(ExchangeToQueueBindingSpecification("it-fan", "it-e2e-a"))
    management.bind(ExchangeToExchangeBindingSpecification("it-fan", "it-loop", ""))
    # Back to where the message came in: a cycle, which routing must leave.
    management.bind(ExchangeToExchangeBindingSpecification("it-loop", "it-entry", "orders.new"))
    management.bind(ExchangeToQueueBindingSpecification("it-loop", "it-e2e-b", "orders.new"))
    # A second way to it-e2e-a: still one copy.
    management.bind(ExchangeToQueueBindingSpecification("it-entry", "it-e2e-a", "orders.#"))

    def send(key: str, body: str) -> None:
        publisher = connection.publisher(AddressHelper.exchange_address("it-entry", key))
        try:
            status = publisher.publish(ClientMessage(body=body.encode()))
            assert status.remote_state == OutcomeState.ACCEPTED
        finally:
            publisher.close()

    send("orders.new", "new")
    send("orders.old", "old")
    # Routed nowhere: released, which the client raises as a SendException.
    with pytest.raises(SendException):
        send("refunds.new", "refund")
    assert server.queue("it-e2e-a").ready == 2
    assert server.queue("it-e2e-b").ready == 1
    assert consume(server.url, "/queues/it-e2e-a", 2).bodies == [b"new", b"old"]
    assert consume(server.url, "/queues/it-e2e-b", 1).bodies == [b"new"]

    [listed] = _listed(management, "src=it-entry&dste=it-fan&key=orders.*")
    location = "/bindings/src=it-entry;dste=it-fan;key=orders.%2A;args="
    assert (listed["destination_exchange"], listed["location"]) == ("it-fan", location)
    # The client 1.0.1 unbinds with dstq=it-fan (its bug); no queue has that name.
    management.unbind(entry_to_fan)
    send("orders.new", "direct-only")
    assert server.queue("it-e2e-a").ready == 1
    assert server.queue("it-e2e-b").ready == 0

    # Deleting an exchange takes its bindings as a source and as a destination.
    management.delete_exchange("it-loop")
    registry = server.server.registry
    left = server.call(
        lambda: registry.bindings("it-fan") + registry.bindings(destination="it-entry")
    )
    assert [(b.source, b.destination) for b in left] == [("it-fan", "it-e2e-a")]
    for name in ("it-entry", "it-fan"):
        management.delete_exchange(name)
    management.close()


def test_an_auto_delete_exchange_goes_with_its_last_binding_to_an_exchange(
    connection: Connection, server: RunningServer
) -> None:
    management = connection.management()
    # The client's declare_exchange() does not send auto_delete.
    declaration = {"type": "fanout", "durable": True, "auto_delete": True, "internal": False}
    management.request(declaration, "/exchanges/it-auto", "PUT", [204])
    management.declare_exchange(ExchangeSpecification(name="it-target"))
    binding = ExchangeToExchangeBindingSpecification("it-auto", "it-target", "k")
    management.bind(binding)
    management.unbind(binding)
    names = server.call(lambda: [e.name for e in server.server.registry.exchanges()])
    assert "it-auto" not in names
    assert "it-target" in names
    management.delete_exchange("it-target")
    management.close()


def test_headers_and_exchange_bindings_survive_a_restart(tmp_path: Path) -> None:
    running = start_server(data_dir=tmp_path)
    with _connected(running) as connection:
        management = connection.management()
        management.declare_exchange(
            ExchangeSpecification(name="d-colours", exchange_type=ExchangeType.headers)
        )
        management.declare_exchange(
            ExchangeSpecification(name="d-entry", exchange_type=ExchangeType.topic)
        )
        management.declare_exchange(
            ExchangeSpecification(
                name="d-transient", exchange_type=ExchangeType.fanout, is_durable=False
            )
        )
        management.declare_queue(ClassicQueueSpecification(name="d-q"))
        for colour in ("red", "blue", "green"):
            _bind_with_arguments(
                management, "d-colours", "d-q", {"x-match": "any", "colour": colour}
            )
        management.bind(ExchangeToExchangeBindingSpecification("d-entry", "d-colours", "paint.#"))
        management.bind(ExchangeToExchangeBindingSpecification("d-entry", "d-transient", "#"))
        management.bind(ExchangeToQueueBindingSpecification("d-transient", "d-q", ""))
        [blue] = [
            b
            for b in _listed(management, "src=d-colours&dstq=d-q&key=")
            if b["arguments"] == {"x-match": "any", "colour": "blue"}
        ]
        management.unbind(str(blue["location"]))
        management.close()
    running.stop()

    running = start_server(data_dir=tmp_path)
    try:
        registry = running.server.registry
        bindings = running.call(
            lambda: registry.bindings("d-colours") + registry.bindings("d-entry")
        )
        assert sorted((b.destination, dict(b.arguments).get("colour")) for b in bindings) == [
            ("d-colours", None),
            ("d-q", "green"),
            ("d-q", "red"),
        ]
        # The transient exchange and the bindings to it and from it did not survive.
        assert running.call(lambda: registry.bindings(destination="d-transient")) == []
        messages = [
            _with_properties("red", colour="red"),
            _with_properties("blue", colour="blue"),
            _with_properties("green", colour="green"),
        ]
        outcomes = publish(running.url, "/exchanges/d-entry/paint.wall", messages=messages)
        assert outcomes.outcomes == ["accepted", "released", "accepted"]
        assert consume(running.url, "/queues/d-q", 2).bodies == ["red", "green"]
    finally:
        running.stop()


def test_malformed_application_properties_at_a_headers_exchange_are_rejected(
    connection: Connection, server: RunningServer
) -> None:
    """The bad message is rejected at publish whatever its exchange, the next one routed."""
    management = connection.management()
    management.declare_queue(ClassicQueueSpecification(name="it-headers-bad"))
    _bind_with_arguments(management, "amq.headers", "it-headers-bad", {"ok": None})
    # application-properties that are a list, not a map; then a body.
    bad = b"\x00\x53\x74\xc0\x01\x00" + b"\x00\x53\x77\xa1\x03bad"
    good = Message(body="good", properties={"ok": 1}).encode()
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach("headers-publisher", "sender", target="/exchanges/amq.headers")
        client.wait_attach(handle)
        client.wait_credit(handle)
        sent = [client.send(handle, bad), client.send(handle, good)]
        outcomes = client.wait_outcomes(sent)
    rejected, accepted = (outcomes[delivery] for delivery in sent)
    assert rejected is not None
    assert accepted is not None
    assert (rejected.name, rejected["error"]["condition"]) == ("rejected", "amqp:decode-error")
    assert accepted.name == "accepted"
    # The same bytes through a direct exchange are refused at the door too: dead-lettering and
    # filters would read them after the message was accepted.
    management.bind(ExchangeToQueueBindingSpecification("amq.direct", "it-headers-bad", "k"))
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle = client.attach("direct-publisher", "sender", target="/exchanges/amq.direct/k")
        client.wait_attach(handle)
        client.wait_credit(handle)
        delivery = client.send(handle, bad)
        outcome = client.wait_outcomes([delivery])[delivery]
    assert outcome is not None
    assert (outcome.name, outcome["error"]["condition"]) == ("rejected", "amqp:decode-error")
    assert server.queue("it-headers-bad").ready == 1
    management.delete_queue("it-headers-bad")
    management.close()
