"""Publish routing without a server: envelopes, targets, refusals, and the annotations added."""

from __future__ import annotations

from sluicegate.gateway.rules.routing import Router
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol, Timestamp
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import MESSAGE_ANNOTATIONS, Header, encode_header, sections

_BODY = encode(Described(0x77, "body"))


def _properties(**fields: object) -> bytes:
    names = ["message-id", "user-id", "to", "subject"] + ["x"] * 4 + ["absolute-expiry-time"]
    values = [fields.get(name.replace("-", "_")) for name in names]
    return b"\x00\x53\x73" + encode(values)  # type: ignore[arg-type]


def _router(now: int = 10_000) -> Router:
    registry = QueueRegistry(Clock(now))
    registry.declare_queue("q")
    registry.declare_exchange("t", "topic")
    registry.bind("t", "q", "a.*")
    return Router(registry)


def test_a_queue_target_stores_with_routing_annotations_and_expiry() -> None:
    router = _router()
    target = router.resolve("/queues/q")
    payload = encode_header(Header(ttl=500)) + _BODY
    routed = router.route(target, payload)
    assert routed.outcome is Outcome.ACCEPTED
    assert [q.name for q in routed.queues] == ["q"]
    message = routed.message
    assert isinstance(message, Message)
    assert message.expires == 10_500
    assert message.payload.endswith(_BODY)
    annotations = [v for code, v, _, _ in sections(message.payload) if code == MESSAGE_ANNOTATIONS]
    assert annotations == [{Symbol("x-exchange"): "", Symbol("x-routing-key"): "q"}]


def test_a_malformed_header_is_rejected_with_decode_error() -> None:
    router = _router()
    routed = router.route(router.resolve("q"), b"\x00\x53\x70\xa1\x01x" + _BODY)
    assert routed.outcome is Outcome.REJECTED
    assert routed.queues == []
    assert routed.error is not None
    assert routed.error.condition == "amqp:decode-error"


def test_exchange_targets_use_the_address_key_or_the_subject() -> None:
    router = _router()
    assert [q.name for q in router.route(router.resolve("/exchanges/t/a.b"), _BODY).queues] == ["q"]
    by_subject = router.route(router.resolve("/exchanges/t"), _properties(subject="a.c") + _BODY)
    assert [q.name for q in by_subject.queues] == ["q"]
    unroutable = router.route(router.resolve("/exchanges/t/b"), _BODY)
    assert (unroutable.outcome, unroutable.queues) == (Outcome.RELEASED, [])


def test_the_null_target_needs_a_to_address() -> None:
    router = _router()
    anonymous = router.resolve(None)
    missing = router.route(anonymous, _BODY)
    assert missing.outcome is Outcome.REJECTED
    assert missing.error is not None
    assert missing.error.condition == "amqp:precondition-failed"
    # RabbitMQ routes it through the default exchange to no queue: released, no error.
    nowhere = router.route(anonymous, _properties(to="/queues/absent") + _BODY)
    assert (nowhere.outcome, nowhere.queues, nowhere.error) == (Outcome.RELEASED, [], None)
    found = router.route(anonymous, _properties(to="/exchanges/t/a.x") + _BODY)
    assert [q.name for q in found.queues] == ["q"]


def test_absolute_expiry_time_wins_when_sooner() -> None:
    router = _router(now=10_000)
    header = encode_header(Header(ttl=5_000))
    sooner = _properties(absolute_expiry_time=Timestamp(12_000))
    routed = router.route(router.resolve("q"), header + sooner + _BODY)
    assert routed.message is not None
    assert routed.message.expires == 12_000
    later = _properties(absolute_expiry_time=Timestamp(99_000))
    routed = router.route(router.resolve("q"), header + later + _BODY)
    assert routed.message is not None
    assert routed.message.expires == 15_000


def test_a_topic_match_past_its_bound_is_rejected_and_the_next_routed() -> None:
    """Bindings made to be slow and a subject of 5,000 words: rejected with
    amqp:resource-limit-exceeded instead of seconds of matching; other keys route as before."""
    router = _router()
    for n in range(50):
        router.registry.bind("t", "q", ".".join(["#", *["*"] * 100, f"z{n}"]))
    routed = router.route(
        router.resolve("/exchanges/t"), _properties(subject=".".join(["a"] * 5000)) + _BODY
    )
    assert routed.outcome is Outcome.REJECTED
    assert routed.error is not None
    assert routed.error.condition == "amqp:resource-limit-exceeded"
    assert [q.name for q in router.route(router.resolve("/exchanges/t/a.b"), _BODY).queues] == ["q"]
