"""An error condition's description is cut to fit the smallest frames a client may take
(gateway/conditions.py): a CLOSE, END or DETACH cannot span frames (AMQP 1.0 §2.7.1)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.gateway.conditions import MAX_DESCRIPTION, condition, condition_of
from sluicegate.queues.errors import NotFound


@given(st.text(max_size=2_000))
def test_a_description_is_kept_whole_or_cut_within_the_bound(description: str) -> None:
    made = condition("amqp:not-found", description)
    assert made.name == "amqp:not-found"
    kept = made.description
    assert kept is not None
    assert len(kept.encode()) <= MAX_DESCRIPTION
    if len(description.encode()) <= MAX_DESCRIPTION:
        assert kept == description
    else:
        assert kept.endswith("...")
        assert description.startswith(kept[:-3])


def test_an_errors_condition_names_it_and_is_cut_the_same_way() -> None:
    made = condition_of(NotFound("no queue '" + "q" * 1_000 + "'"))
    assert made.name == "amqp:not-found"
    assert made.description is not None
    assert len(made.description.encode()) == MAX_DESCRIPTION
