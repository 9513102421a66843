"""Headers exchanges and exchange-to-exchange bindings in the registry: routing and lifecycle."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.examples import examples

from sluicegate.queues.errors import NotFound, PreconditionFailed
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import AccessRefused, QueueRegistry
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import DecodeError


def _names(queues: list[QueueType]) -> list[str]:
    return sorted(q.name for q in queues)


def _with_properties(properties: dict[str, object]) -> bytes:
    section = encode(Described(0x74, dict(properties)))  # type: ignore[arg-type]
    return b"\x00\x53\x70\x45" + section + encode(Described(0x77, "body"))


def test_a_headers_exchange_routes_by_application_properties() -> None:
    registry = QueueRegistry()
    for name in ("eu-orders", "any-urgent", "everything"):
        registry.declare_queue(name)
    registry.declare_exchange("h", "headers")
    registry.bind("h", "eu-orders", "", {"region": "eu", "type": "order"})
    registry.bind("h", "any-urgent", "", {"x-match": "any", "urgent": True, "priority": 9})
    registry.bind("h", "everything", "ignored-key")
    route = registry.route
    assert _names(route("h", "", _with_properties({"region": "eu", "type": "order"}))) == [
        "eu-orders",
        "everything",
    ]
    assert _names(route("h", "any key", _with_properties({"priority": 9}))) == [
        "any-urgent",
        "everything",
    ]
    assert _names(route("h", "", _with_properties({"region": "us", "type": "order"}))) == [
        "everything"
    ]
    # A message without application-properties still routes (to the bindings that ask nothing).
    assert _names(route("h", "", encode(Described(0x77, "body")))) == ["everything"]
    with pytest.raises(DecodeError):
        route("h", "", b"\x00\x53\x70\x45\x00\x53\x74\xc0\x01\x00")


def test_amq_headers_and_amq_match_exist_from_the_start() -> None:
    registry = QueueRegistry()
    assert registry.exchange("amq.headers").type.value == "headers"
    assert registry.exchange("amq.match").type.value == "headers"
    with pytest.raises(AccessRefused):
        registry.delete_exchange("amq.match")


def test_a_bad_x_match_is_refused_only_by_a_headers_exchange() -> None:
    registry = QueueRegistry()
    registry.declare_queue("q")
    with pytest.raises(PreconditionFailed, match="x-match"):
        registry.bind("amq.headers", "q", "", {"x-match": "some"})
    assert registry.bindings("amq.headers") == []
    registry.bind("amq.direct", "q", "k", {"x-match": "some"})
    assert _names(registry.route("amq.direct", "k")) == ["q"]


def test_bindings_that_differ_by_arguments_are_distinct() -> None:
    registry = QueueRegistry()
    registry.declare_queue("q")
    registry.bind("amq.headers", "q", "", {"x-match": "any", "colour": "red"})
    registry.bind("amq.headers", "q", "", {"x-match": "any", "colour": "blue"})
    # The same arguments in another order are the same binding.
    registry.bind("amq.headers", "q", "", {"colour": "blue", "x-match": "any"})
    assert len(registry.bindings("amq.headers")) == 2
    blue = _with_properties({"colour": "blue"})
    assert _names(registry.route("amq.headers", "", blue)) == ["q"]
    assert registry.unbind("amq.headers", "q", "", {"colour": "blue", "x-match": "any"})
    assert registry.route("amq.headers", "", blue) == []
    assert _names(registry.route("amq.headers", "", _with_properties({"colour": "red"}))) == ["q"]
    # Two direct bindings to one queue, differing by arguments: one copy, until both go.
    registry.bind("amq.direct", "q", "k", {"a": 1})
    registry.bind("amq.direct", "q", "k", {"a": 2})
    assert _names(registry.route("amq.direct", "k")) == ["q"]
    assert registry.unbind("amq.direct", "q", "k", {"a": 1})
    assert _names(registry.route("amq.direct", "k")) == ["q"]
    assert not registry.unbind("amq.direct", "q", "k")
    assert registry.unbind("amq.direct", "q", "k", {"a": 2})
    assert registry.route("amq.direct", "k") == []


def test_exchange_to_exchange_bindings_route_transitively_each_queue_once() -> None:
    registry = QueueRegistry()
    for name in ("q1", "q2", "q3"):
        registry.declare_queue(name)
    registry.declare_exchange("a", "topic")
    registry.declare_exchange("b", "direct")
    registry.declare_exchange("c", "fanout")
    registry.bind("a", "b", "orders.*", to_exchange=True)
    registry.bind("b", "c", "orders.new", to_exchange=True)
    registry.bind("a", "q1", "orders.#")
    registry.bind("b", "q2", "orders.new")
    registry.bind("c", "q1")
    registry.bind("c", "q3")
    # A cycle back to the start and into the middle.
    registry.bind("c", "a", "", to_exchange=True)
    registry.bind("c", "b", "", to_exchange=True)
    routed = registry.route("a", "orders.new")
    assert sorted(q.name for q in routed) == ["q1", "q2", "q3"]
    assert len(routed) == 3
    assert _names(registry.route("a", "orders.old")) == ["q1"]
    assert _names(registry.route("b", "orders.new")) == ["q1", "q2", "q3"]


def test_a_headers_exchange_on_the_way_reads_the_headers() -> None:
    registry = QueueRegistry()
    registry.declare_queue("q")
    registry.declare_exchange("entry", "fanout")
    registry.bind("entry", "amq.headers", "", to_exchange=True)
    registry.bind("amq.headers", "q", "", {"kind": "audit"})
    assert _names(registry.route("entry", "", _with_properties({"kind": "audit"}))) == ["q"]
    assert registry.route("entry", "", _with_properties({"kind": "other"})) == []


def test_an_alternate_exchange_takes_what_an_exchange_routes_nowhere() -> None:
    registry = QueueRegistry()
    registry.declare_queue("lost")
    registry.declare_queue("q")
    registry.declare_exchange("ae", "fanout")
    registry.bind("ae", "lost")
    registry.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    registry.declare_exchange("next", "direct")
    registry.bind("main", "next", "k", to_exchange=True)
    # Routed on to an exchange is routed somewhere: the alternate exchange is not used.
    assert registry.route("main", "k") == []
    assert _names(registry.route("main", "other")) == ["lost"]
    registry.bind("next", "q", "k")
    assert _names(registry.route("main", "k")) == ["q"]


def test_binding_an_exchange_needs_both_to_exist_and_not_be_the_default() -> None:
    registry = QueueRegistry()
    with pytest.raises(NotFound, match="no exchange 'missing'"):
        registry.bind("amq.direct", "missing", "", to_exchange=True)
    with pytest.raises(AccessRefused):
        registry.bind("amq.direct", "", "", to_exchange=True)
    registry.declare_queue("same-name")
    # A queue and an exchange of one name are different destinations.
    with pytest.raises(NotFound):
        registry.bind("amq.direct", "same-name", "", to_exchange=True)


def test_deleting_an_exchange_removes_its_bindings_both_ways() -> None:
    registry = QueueRegistry()
    registry.declare_queue("q")
    registry.declare_exchange("middle", "fanout")
    registry.bind("amq.fanout", "middle", "", to_exchange=True)
    registry.bind("middle", "q")
    registry.delete_exchange("middle")
    assert registry.bindings("amq.fanout") == []
    assert registry.bindings(destination="q") == []
    # Declared again, it starts with no bindings.
    registry.declare_exchange("middle", "fanout")
    assert registry.route("amq.fanout", "") == []


def test_auto_delete_counts_bindings_as_a_source_only() -> None:
    """RabbitMQ's rule: an auto-delete exchange goes when its last binding as a source goes."""
    registry = QueueRegistry()
    registry.declare_queue("q")
    registry.declare_exchange("auto", "fanout", auto_delete=True)
    registry.declare_exchange("target", "fanout")
    registry.declare_exchange("feeder", "fanout")
    # Bound as a destination only: not a reason to stay, and nothing deletes it yet.
    registry.bind("feeder", "auto", "", to_exchange=True)
    registry.bind("auto", "target", "", to_exchange=True)
    registry.bind("target", "q")
    assert registry.unbind("auto", "target", "", to_exchange=True)
    assert "auto" not in [e.name for e in registry.exchanges()]
    assert registry.bindings("feeder") == []
    # Deleting the destination of its last binding deletes it, and so on down the chain.
    registry.declare_exchange("auto", "fanout", auto_delete=True)
    registry.declare_exchange("auto-2", "fanout", auto_delete=True)
    registry.bind("auto-2", "auto", "", to_exchange=True)
    registry.bind("auto", "target", "", to_exchange=True)
    registry.delete_exchange("target")
    assert {"auto", "auto-2", "target"}.isdisjoint(e.name for e in registry.exchanges())


_EXCHANGES = ("x0", "x1", "x2", "x3")
_QUEUES = ("q0", "q1", "q2")
_KEYS = ("k0", "k1")


class ExchangeGraph(RuleBasedStateMachine):
    """Random bindings among direct and fanout exchanges, routing checked against reachability."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = QueueRegistry()
        for index, name in enumerate(_EXCHANGES):
            self.registry.declare_exchange(name, "fanout" if index % 2 else "direct")
        for name in _QUEUES:
            self.registry.declare_queue(name)
        # The model: (source, destination, is an exchange, key).
        self.bindings: set[tuple[str, str, bool, str]] = set()

    @rule(
        source=st.sampled_from(_EXCHANGES),
        exchange=st.sampled_from(_EXCHANGES),
        queue=st.sampled_from(_QUEUES),
        to_exchange=st.booleans(),
        key=st.sampled_from(_KEYS),
    )
    def bind(self, source: str, exchange: str, queue: str, to_exchange: bool, key: str) -> None:
        destination = exchange if to_exchange else queue
        self.registry.bind(source, destination, key, to_exchange=to_exchange)
        self.bindings.add((source, destination, to_exchange, key))

    @rule(data=st.data())
    def unbind(self, data: st.DataObject) -> None:
        if not self.bindings:
            return
        source, destination, to_exchange, key = data.draw(st.sampled_from(sorted(self.bindings)))
        assert self.registry.unbind(source, destination, key, to_exchange=to_exchange)
        self.bindings.discard((source, destination, to_exchange, key))

    @rule(queue=st.sampled_from(_QUEUES))
    def delete_and_redeclare_a_queue(self, queue: str) -> None:
        self.registry.delete_queue(queue)
        self.registry.declare_queue(queue)
        self.bindings = {b for b in self.bindings if b[2] or b[1] != queue}

    @rule(index=st.integers(0, len(_EXCHANGES) - 1))
    def delete_and_redeclare_an_exchange(self, index: int) -> None:
        name = _EXCHANGES[index]
        self.registry.delete_exchange(name)
        self.registry.declare_exchange(name, "fanout" if index % 2 else "direct")
        self.bindings = {b for b in self.bindings if b[0] != name and not (b[2] and b[1] == name)}

    @invariant()
    def counts_match_what_exists(self) -> None:
        """The counters a vhost limit reads (O(1)) agree with the bindings listed."""
        assert self.registry.binding_count == len(self.bindings) == len(self.registry.bindings())
        assert self.registry.exchange_count == len(_EXCHANGES)

    def _reachable(self, start: str, routing_key: str) -> set[str]:
        fanout = {name for index, name in enumerate(_EXCHANGES) if index % 2}
        visited, queues, frontier = {start}, set(), [start]
        while frontier:
            exchange = frontier.pop()
            for source, destination, to_exchange, key in self.bindings:
                if source != exchange or (exchange not in fanout and key != routing_key):
                    continue
                if not to_exchange:
                    queues.add(destination)
                elif destination not in visited:
                    visited.add(destination)
                    frontier.append(destination)
        return queues

    @invariant()
    def routes_to_every_reachable_queue_once(self) -> None:
        for start in _EXCHANGES:
            for key in _KEYS:
                routed = [q.name for q in self.registry.route(start, key)]
                assert len(routed) == len(set(routed))
                assert set(routed) == self._reachable(start, key)
            # A message's x-cc keys walk the graph once, together, to the same queues.
            together = [q.name for q in self.registry.route_keys(start, _KEYS)]
            assert len(together) == len(set(together))
            assert set(together) == set().union(*(self._reachable(start, k) for k in _KEYS))


ExchangeGraph.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=25, deadline=None
)
TestExchangeGraph = ExchangeGraph.TestCase
