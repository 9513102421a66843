"""The annotations of consumers' modified outcomes: measured before decoding, one checked copy
shared by the deliveries of a range, refused when the memory budget has no room for them."""

from __future__ import annotations

import pytest

from sluicegate.gateway.rules.modified_outcomes import ModifiedAnnotations, NoRoomForAnnotations
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.amqp_types import Symbol
from sluicegate.wire.annotations import AnnotationsTooLarge, InvalidAnnotations
from sluicegate.wire.encoding import encode

_LIMIT = 64 * 1024


def _encoded(size: int) -> bytes:
    return encode({Symbol("x-why"): "v" * size})


def _checker(budget: int = 1024 * 1024) -> tuple[ModifiedAnnotations, MemoryBudget, HeldBytes]:
    memory, held = MemoryBudget(budget), HeldBytes()
    return ModifiedAnnotations(_LIMIT, memory, held), memory, held


def test_the_deliveries_of_a_range_share_one_checked_copy() -> None:
    checker, _, _ = _checker()
    first = checker.checked(_encoded(1000))
    # Each delivery event brings its own bytes (proton encodes them again for each).
    again = [checker.checked(_encoded(1000)) for _ in range(10)]
    assert first is not None
    assert all(annotations is first for annotations in again)
    checker.forget()
    assert checker.checked(_encoded(1000)) is not first
    assert checker.checked(None) is None


def test_annotations_over_the_limit_are_refused_unread() -> None:
    checker, _, _ = _checker()
    too_large = bytearray(_encoded(_LIMIT))
    # Unreadable past its first bytes: refused by its size, never decoded.
    too_large[20] = 0xFF
    with pytest.raises(AnnotationsTooLarge, match="max_message_annotations_size 65536"):
        checker.checked(bytes(too_large))
    with pytest.raises(InvalidAnnotations, match="not a symbol starting with 'x-'"):
        checker.checked(encode({Symbol("why"): 1}))


def test_annotations_are_refused_past_the_budget_resume_mark() -> None:
    checker, memory, held = _checker(budget=100_000)
    annotations = _encoded(10_000)
    held.total = memory.resume_at - len(annotations)
    assert checker.checked(annotations) is not None
    held.total += 1
    with pytest.raises(NoRoomForAnnotations):
        checker.checked(annotations)
    held.total = 0
    memory.block()
    with pytest.raises(NoRoomForAnnotations) as refused:
        checker.checked(annotations)
    assert refused.value.condition == "amqp:resource-limit-exceeded"
