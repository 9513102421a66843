"""Management replies carry every value with the AMQP type RabbitMQ 4 gives it.

The expected types are transcribed from RabbitMQ's ``rabbit_amqp_management.erl``
(``encode_queue``, ``encode_bindings``, ``purge_or_delete_queue_response`` and the reply's
properties in ``handle_request``) and, for echoed ``x-*`` arguments, from ``mc_amqpl.erl``'s
``to_091``/``from_091``, the round trip RabbitMQ keeps them through. RabbitMQ's Go client
type-asserts some of them (``replicas`` as ``[]string``: a list made it panic), so each field is
compared by its decoded type, read from the wire by proton without conversion.
"""

from __future__ import annotations

import uuid
from typing import Final, cast

from integration.conftest import RunningServer
from proton import Array, Data, Message, symbol, timestamp, uint, ulong

from sluicegate.clients.management import ManagementClient, request_message

# rabbit_amqp_management:encode_queue/3, key by key (leader: utf8, present when there is one).
QUEUE_TYPES: Final[dict[str, type]] = {
    "message_count": ulong,
    "consumer_count": uint,
    "name": str,
    "vhost": str,
    "durable": bool,
    "auto_delete": bool,
    "exclusive": bool,
    "type": str,
    "arguments": dict,
    "replicas": Array,
    "leader": str,
}
# rabbit_amqp_management:encode_bindings/1; sluicegate adds the HTTP API's other keys.
BINDING_TYPES: Final[dict[str, type]] = {
    "source": str,
    "destination_queue": str,
    "binding_key": str,
    "arguments": dict,
    "location": str,
}


def _exact(value: object, kind: type) -> None:
    # symbol subclasses str and ulong/uint subclass int: compare the class itself.
    assert type(value) is kind, f"{value!r} is a {type(value).__name__}, not {kind.__name__}"


def _check_queue(body: object, name: str) -> None:
    assert isinstance(body, dict)
    assert set(body) == set(QUEUE_TYPES)
    for key, kind in QUEUE_TYPES.items():
        _exact(body[key], kind)
    replicas = body["replicas"]
    assert replicas.type == Data.STRING
    assert list(replicas.elements) == [body["leader"]]
    assert body["leader"].startswith("rabbit@")
    assert body["name"] == name


def test_queue_replies_have_rabbitmqs_types(server: RunningServer) -> None:
    with ManagementClient(server.url) as client:
        declared = client.request("PUT", "/queues/types-q", {"durable": True, "arguments": {}})
        assert declared.status == 201
        _check_queue(declared.body, "types-q")
        again = client.request("PUT", "/queues/types-q", {"durable": True, "arguments": {}})
        assert again.status == 200
        _check_queue(again.body, "types-q")
        info = client.request("GET", "/queues/types-q")
        assert info.status == 200
        _check_queue(info.body, "types-q")
        for method, path in (("DELETE", "/queues/types-q/messages"), ("DELETE", "/queues/types-q")):
            reply = client.request(method, path)
            assert reply.status == 200
            assert isinstance(reply.body, dict)
            assert list(reply.body) == ["message_count"]
            _exact(reply.body["message_count"], ulong)


def test_binding_listing_has_rabbitmqs_types(server: RunningServer) -> None:
    with ManagementClient(server.url) as client:
        assert client.request("PUT", "/queues/types-bq", {}).status == 201
        exchange = {"type": "direct", "durable": True, "internal": False, "arguments": {}}
        assert client.request("PUT", "/exchanges/types-x", exchange).status == 204
        binding = {
            "source": "types-x",
            "destination_queue": "types-bq",
            "binding_key": "k",
            "arguments": {},
        }
        assert client.request("POST", "/bindings", binding).status == 204
        listed = client.request("GET", "/bindings?src=types-x&dstq=types-bq&key=k")
        assert listed.status == 200
        _exact(listed.body, list)
        assert isinstance(listed.body, list)
        (item,) = listed.body
        for key, kind in BINDING_TYPES.items():
            _exact(item[key], kind)


def test_echoed_arguments_come_back_as_rabbitmqs_round_trip_gives_them(
    server: RunningServer,
) -> None:
    """mc_amqpl: a symbol becomes utf8, ulong long, a timestamp
    whole seconds, a map's keys symbols; the rest keeps its type."""
    sent = {
        "x-max-length": 10,
        "x-t-symbol": symbol("abc"),
        "x-t-ulong": ulong(5),
        "x-t-uint": uint(6),
        "x-t-bool": True,
        "x-t-list": [symbol("a"), ulong(1)],
        "x-t-map": {"k": 1},
        "x-t-time": timestamp(1_700_000_000_123),
    }
    expected = {
        "x-max-length": (10, int),
        "x-t-symbol": ("abc", str),
        "x-t-ulong": (5, int),
        "x-t-uint": (6, uint),
        "x-t-bool": (True, bool),
        "x-t-list": (["a", 1], list),
        "x-t-map": ({symbol("k"): 1}, dict),
        "x-t-time": (timestamp(1_700_000_000_000), timestamp),
    }
    with ManagementClient(server.url) as client:
        declared = client.request("PUT", "/queues/types-args", {"arguments": sent})
        assert declared.status == 201, declared.body
        assert isinstance(declared.body, dict)
        arguments = declared.body["arguments"]
        assert set(arguments) == set(expected)
        for key, (value, kind) in expected.items():
            assert arguments[key] == value, key
            _exact(arguments[key], kind)
        assert all(type(key) is symbol for key in arguments["x-t-map"])
        assert [type(item) for item in arguments["x-t-list"]] == [str, int]


def test_reply_properties_are_rabbitmqs(server: RunningServer) -> None:
    """subject the status as utf8, correlation-id the request's message-id, application
    property ``http:response`` = ``"1.1"``, and an amqp-value body, null for a 204."""
    with ManagementClient(server.url) as client:
        sender = client._requests
        replies = client._replies
        request = request_message("PUT", "/exchanges/types-px", {"type": "fanout"})
        request.id = str(uuid.uuid4())
        sender.send(request, timeout=10)
        reply: Message = replies.receive(timeout=10)
        assert reply.subject == "204"
        _exact(reply.subject, str)
        fields = (reply.correlation_id, cast(object, reply.properties), reply.body)
        assert fields == (request.id, {"http:response": "1.1"}, None)
