"""Queues, exchanges and bindings from the configuration file: loaded, checked, declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.gateway.config import ConfigError, ServerConfig, load_config
from sluicegate.gateway.rules.definitions import apply_definitions
from sluicegate.queues.errors import NotFound
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

DEFINITIONS = """
[[queues]]
name = "orders"
arguments = { "x-message-ttl" = 60000, "x-dead-letter-exchange" = "dlx" }

[[queues]]
name = "orders-dead"
durable = false

[[exchanges]]
name = "dlx"
type = "fanout"

[[exchanges]]
name = "events"
type = "topic"
arguments = { "x-unroutable" = "reject" }

[[bindings]]
source = "dlx"
destination = "orders-dead"

[[bindings]]
source = "events"
destination = "orders"
binding_key = "order.*"
"""


def test_bindings_to_exchanges_and_headers_bindings(tmp_path: Path) -> None:
    text = """
[[queues]]
name = "eu"

[[exchanges]]
name = "regions"
type = "headers"

[[bindings]]
source = "amq.topic"
destination = "regions"
destination_type = "exchange"
binding_key = "order.#"

[[bindings]]
source = "regions"
destination = "eu"
arguments = { "x-match" = "any", "region" = "eu" }
"""
    file = tmp_path / "sluicegate.toml"
    file.write_text(text)
    config = load_config(file, environ={})
    registry = QueueRegistry()
    apply_definitions({"/": registry}, config.queues, config.exchanges, config.bindings)
    eu = encode(Described(0x74, {"region": "eu"})) + encode(Described(0x77, "body"))
    assert [q.name for q in registry.route("amq.topic", "order.new", eu)] == ["eu"]
    assert registry.route("amq.topic", "refund.new", eu) == []


def _load(tmp_path: Path, text: str) -> object:
    file = tmp_path / "sluicegate.toml"
    file.write_text(text)
    return load_config(file, environ={})


def test_definitions_load_and_declare(tmp_path: Path) -> None:
    file = tmp_path / "sluicegate.toml"
    file.write_text(DEFINITIONS)
    config = load_config(file, environ={})
    registry = QueueRegistry()
    apply_definitions({"/": registry}, config.queues, config.exchanges, config.bindings)
    assert [info.name for info in registry.queues()] == ["orders", "orders-dead"]
    assert registry.settings("orders").arguments.message_ttl == 60000
    assert not registry.settings("orders-dead").durable
    assert [q.name for q in registry.route("events", "order.created")] == ["orders"]
    assert [q.name for q in registry.route("dlx", "anything")] == ["orders-dead"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[queues]]\nname = "q"\narguments = { "x-max-length" = -1 }',
            "queues\\[0\\] 'q'.*x-max-length",
        ),
        ('[[queues]]\nname = "q"\ncolour = "red"', "queues\\[0\\]: unknown key 'colour'"),
        ("[[queues]]\ndurable = true", "queues\\[0\\]: missing name"),
        ("[[queues]]\nname = 5", "queues\\[0\\].name: expected str"),
        ('[[exchanges]]\nname = "e"\ntype = "nonsense"', "exchanges\\[0\\] 'e'.*nonsense"),
        ('[[bindings]]\nsource = "amq.topic"\ndestination = "absent"', "bindings\\[0\\].*absent"),
        (
            '[[bindings]]\nsource = "amq.topic"\ndestination = "amq.direct"\n'
            'destination_type = "stream"',
            "bindings\\[0\\]: destination_type must be 'queue' or 'exchange'",
        ),
        (
            '[[bindings]]\nsource = "amq.headers"\ndestination = "amq.direct"\n'
            'destination_type = "exchange"\narguments = { "x-match" = "every" }',
            "bindings\\[0\\]: Invalid x-match",
        ),
        ('queues = "orders"', "queues: expected an array of tables"),
    ],
)
def test_bad_definitions_name_the_entry(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, text)


def test_definitions_go_to_their_virtual_host(tmp_path: Path) -> None:
    """As in RabbitMQ's definitions: each entry names its vhost, ``/`` when it names none."""
    text = """
[vhosts.tenant]

[[queues]]
name = "orders"

[[queues]]
name = "orders"
vhost = "tenant"

[[exchanges]]
name = "events"
type = "fanout"
vhost = "tenant"

[[bindings]]
source = "events"
destination = "orders"
vhost = "tenant"
"""
    config = _load(tmp_path, text)
    assert isinstance(config, ServerConfig)
    registries = {"/": QueueRegistry(), "tenant": QueueRegistry()}
    apply_definitions(registries, config.queues, config.exchanges, config.bindings)
    assert [q.name for q in registries["tenant"].route("events", "")] == ["orders"]
    assert registries["/"].get("orders") is not None
    with pytest.raises(NotFound):
        registries["/"].exchange("events")
    unknown = '[[queues]]\nname = "q"\nvhost = "nowhere"'
    with pytest.raises(ConfigError, match="queues\\[0\\] 'q': no virtual host 'nowhere'"):
        _load(tmp_path, unknown)
