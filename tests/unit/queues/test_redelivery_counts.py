"""The counts a quorum queue stamps on a message that comes back, pure: ``x-delivery-count``
(RabbitMQ 4.2) and ``x-acquired-count`` (4.3), the times it was acquired before."""

from __future__ import annotations

import pytest

from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Outcome
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.annotations import merge_annotations
from sluicegate.wire.decoding import decode
from sluicegate.wire.encoding import encode
from sluicegate.wire.redelivery_counts import redelivery_annotations, with_redelivery_counts
from sluicegate.wire.sections import read_header

COUNTS = (Symbol("x-delivery-count"), Symbol("x-acquired-count"))


def _message(body: str) -> Message:
    return Message(encode(Described(0x77, body)))


def _annotations(message: Message) -> dict[Value, Value]:
    pos = 0
    payload = message.read()
    while pos < len(payload):
        section, pos = decode(payload, pos)
        assert isinstance(section, Described)
        if section.descriptor == 0x72:
            assert isinstance(section.value, dict)
            return section.value
    return {}


def test_each_return_counts_and_the_header_counts_only_failures() -> None:
    registry = QueueRegistry(Clock(1_000))
    queue = registry.declare_queue("qq", {"x-queue-type": "quorum"})
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    (first,), _ = queue.credit("c", 0, 1, False)
    assert not set(COUNTS) & set(_annotations(first))
    outcomes = [
        (Outcome.RELEASED, False, None),
        (Outcome.MODIFIED, False, encode({Symbol("x-opt-key"): "value"})),
        (Outcome.MODIFIED, True, None),
    ]
    message = first
    for returns, (outcome, failed, added) in enumerate(outcomes, start=1):
        queue.settle("c", [message.seq], outcome, failed, annotations=added)
        # What the queue counts as ready is what goes on the wire, stamp included.
        statistics = queue.statistics()
        assert statistics.ready == 1
        assert statistics.ready_bytes == message.read_size()
        (message,), _ = queue.credit("c", returns, 1, False)
        annotations_now = _annotations(message)
        assert [annotations_now[key] for key in COUNTS] == [returns, returns]
    assert _annotations(message)[Symbol("x-opt-key")] == "value"
    assert read_header(message.read()).delivery_count == 1


def test_a_classic_queue_stamps_nothing() -> None:
    registry = QueueRegistry(Clock(1_000))
    queue = registry.declare_queue("classic")
    queue.enqueue(_message("m"))
    queue.attach("c", ack_required=True)
    (message,), _ = queue.credit("c", 0, 1, False)
    queue.settle("c", [message.seq], Outcome.RELEASED, False)
    (again,), _ = queue.credit("c", 1, 1, False)
    assert not set(COUNTS) & set(_annotations(again))


def test_the_counts_are_longs_as_rabbitmq_annotates_integers() -> None:
    encoded = redelivery_annotations(2)
    assert encoded.count(b"\x81" + (2).to_bytes(8, "big")) == 2


@pytest.mark.parametrize(
    "sections",
    [
        [Described(0x77, "no annotations")],
        [Described(0x70, [True]), Described(0x77, "a header first")],
        [
            Described(0x70, [True]),
            Described(0x72, {Symbol("x-exchange"): "", Symbol("x-delivery-count"): 7}),
            Described(0x73, ["id"]),
            Described(0x77, "annotated"),
        ],
    ],
)
def test_the_cached_splice_is_the_general_merge(sections: list[Described]) -> None:
    payload = b"".join(encode(section) for section in sections)
    for acquired in (1, 2, 1):
        expected = merge_annotations(payload, redelivery_annotations(acquired))
        assert with_redelivery_counts(payload, acquired) == expected
