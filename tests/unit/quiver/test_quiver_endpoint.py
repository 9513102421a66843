"""The quiver URL rule: host, port, and which paths are addresses whole."""

from __future__ import annotations

import pytest

from sluicegate.clients.quiver.endpoint import Endpoint, UrlError, parse_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("amqp://127.0.0.1:5672/q1", Endpoint("127.0.0.1", 5672, "q1")),
        ("//127.0.0.1:5674/q1", Endpoint("127.0.0.1", 5674, "q1")),
        ("amqp://example.net/jobs", Endpoint("example.net", 5672, "jobs")),
        ("amqp://h:1/jobs/alpha", Endpoint("h", 1, "jobs/alpha")),
        ("amqp://h:5672/queues/q1", Endpoint("h", 5672, "/queues/q1")),
        ("amqp://h/exchanges/amq.topic/a.b", Endpoint("h", 5672, "/exchanges/amq.topic/a.b")),
        ("amqp://h/queue/q1", Endpoint("h", 5672, "/queue/q1")),
        ("amqp://h/amq/queue/q1", Endpoint("h", 5672, "/amq/queue/q1")),
        ("amqp://h/queues/my%20queue", Endpoint("h", 5672, "/queues/my%20queue")),
        ("amqp://[::1]:5672/q", Endpoint("::1", 5672, "q")),
    ],
)
def test_parse(url: str, expected: Endpoint) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h/q", "unsupported scheme"),
        ("amqps://h/q", "unsupported scheme"),
        ("q1", "no host"),
        ("amqp:///q1", "no host"),
        ("amqp://h:99999/q", "bad port"),
        ("amqp://h:x/q", "bad port"),
        ("amqp://h:0/q", "port 0"),
        ("amqp://h:5672", "no address"),
        ("amqp://h:5672/", "no address"),
        ("amqp://h/queues/", "no address"),
        ("amqp://h/q?x=1", "does not use"),
        ("amqp://u:p@h/q", "does not use"),
    ],
)
def test_reject(url: str, message: str) -> None:
    with pytest.raises(UrlError, match=message):
        parse_url(url)


def test_host_port_brackets_ipv6() -> None:
    assert Endpoint("::1", 5672, "q").host_port == "[::1]:5672"
    assert Endpoint("127.0.0.1", 5672, "q").host_port == "127.0.0.1:5672"
