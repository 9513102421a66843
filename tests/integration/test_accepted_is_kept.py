"""Accepted means kept: arbitrary valid AMQP messages through every path, then a restart.

Hypothesis makes persistent messages with application-properties, message and delivery
annotations nested up to and past the codec's depth limit, and bodies up to 256 KiB. Each goes
one way through a real server: a fanout to two durable queues (one body, two copies), a headers
exchange that reads its application-properties, a filtered consumer that rejects it
(dead-lettered ``rejected``), a queue that expires it (``expired``), one that overflows
(``maxlen``) and one whose consumer fails it past its limit (``delivery_limit``). What the
server accepts must all be there after a restart; what it refuses must have been refused at
the door with ``amqp:decode-error``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from integration.conftest import start_server
from proton import Described, Message, symbol, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection
from support.clients import consume, publish

from sluicegate.gateway.rules.definitions import (
    BindingDefinition,
    ExchangeDefinition,
    QueueDefinition,
)
from sluicegate.wire.decoding import MAX_DEPTH

_DLX = {"x-dead-letter-exchange": "dlx"}
_QUEUES = (
    QueueDefinition("work", arguments=_DLX),
    QueueDefinition("copy"),
    QueueDefinition("ttl", arguments={**_DLX, "x-message-ttl": 0}),
    QueueDefinition("small", arguments={**_DLX, "x-max-length": 1}),
    QueueDefinition("limit", arguments={**_DLX, "x-delivery-limit": 0}),
    QueueDefinition("dead"),
)
_EXCHANGES = (
    ExchangeDefinition("fan", "fanout"),
    ExchangeDefinition("hdr", "headers"),
    ExchangeDefinition("dlx", "fanout"),
)
_BINDINGS = (
    BindingDefinition("fan", "work"),
    BindingDefinition("fan", "copy"),
    BindingDefinition("hdr", "work", arguments={"x-match": "any", "path": "headers"}),
    BindingDefinition("dlx", "dead"),
)
# Where each path publishes, and the copies it leaves in the log.
_PATHS = {
    "fanout": ("/exchanges/fan", 2),
    "headers": ("/exchanges/hdr", 1),
    "filter": ("/queues/work", 1),
    "expired": ("/queues/ttl", 1),
    "maxlen": ("/queues/small", 1),
    "delivery_limit": ("/queues/limit", 1),
}

_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.booleans(),
    st.none(),
)


@st.composite
def _nested(draw: st.DrawFn) -> object:
    """A value nested 0 to MAX_DEPTH + 8 levels deep: past the limit is refused at the door."""
    value: object = draw(_scalars)
    for _ in range(draw(st.integers(min_value=0, max_value=MAX_DEPTH + 8))):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


@st.composite
def _message(draw: st.DrawFn, number: int) -> tuple[str, Message]:
    path = draw(st.sampled_from(sorted(_PATHS)))
    properties = {"n": number, "path": path}
    properties.update(draw(st.dictionaries(st.text(max_size=8), _nested(), max_size=3)))
    properties["n"], properties["path"] = number, path
    annotations = draw(st.dictionaries(st.just(symbol("x-opt-a")), _nested(), max_size=1))
    instructions = draw(st.dictionaries(st.just(symbol("x-opt-d")), _nested(), max_size=1))
    body: Any = draw(st.one_of(st.binary(max_size=256 * 1024), st.text(max_size=100), _nested()))
    message = Message(
        body=body,
        durable=True,
        properties=properties,
        annotations=annotations or None,
        instructions=instructions or None,
    )
    return path, message


def _reject_filtered(url: str, count: int) -> None:
    """A consumer filtering on application-properties rejects what it matches (dead-letters)."""
    wanted = Filter({symbol("path"): Described(ulong(0x174), {"path": "filter"})})
    connection = BlockingConnection(url)
    try:
        receiver = connection.create_receiver("/queues/work", credit=count, options=wanted)
        for _ in range(count):
            receiver.receive(timeout=10)
            receiver.reject()
    finally:
        connection.close()


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_nothing_accepted_is_lost_on_any_path_or_across_a_restart(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data_dir: Path = tmp_path_factory.mktemp("kept")
    settings_: dict[str, Any] = {
        "data_dir": data_dir,
        "queues": _QUEUES,
        "exchanges": _EXCHANGES,
        "bindings": _BINDINGS,
        "max_message_size": 1024 * 1024,
    }
    drawn = [data.draw(_message(n)) for n in range(data.draw(st.integers(1, 6)))]
    running = start_server(**settings_)
    accepted: Counter[str] = Counter()
    paths: dict[int, str] = {}
    try:
        for number, (path, message) in enumerate(drawn):
            outcomes = publish(running.url, _PATHS[path][0], messages=[message]).outcomes
            assert outcomes in (["accepted"], ["rejected"])
            if outcomes == ["accepted"]:
                accepted[path] += 1
                paths[number] = path
        if accepted["filter"]:
            _reject_filtered(running.url, accepted["filter"])
        if accepted["delivery_limit"]:
            failed = accepted["delivery_limit"]
            consume(running.url, "/queues/limit", failed, decide=lambda message, index: "modify")
    finally:
        running.stop()
    restarted = start_server(**settings_)
    try:
        held = {queue.name: restarted.queue(queue.name).ready for queue in _QUEUES}
        expected = {
            "work": accepted["fanout"] + accepted["headers"],
            "copy": accepted["fanout"],
            "small": min(1, accepted["maxlen"]),
            "dead": accepted["filter"]
            + accepted["expired"]
            + max(0, accepted["maxlen"] - 1)
            + accepted["delivery_limit"],
        }
        for queue, count in expected.items():
            assert held[queue] == count, (queue, held, paths)
        dead = consume(restarted.url, "/queues/dead", expected["dead"]).messages
        numbers = {cast("dict[str, object]", m.properties)["n"] for m in dead}
        assert len(numbers) == expected["dead"]
    finally:
        restarted.stop()
