"""The outcomes a consumer's ATTACH reply states (gateway/rules/outcomes.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.gateway.rules.outcomes import OUTCOMES, stated_outcomes
from sluicegate.queues.errors import NotImplementedByServer


def test_a_client_that_lists_none_is_told_all_four() -> None:
    assert stated_outcomes(None) == OUTCOMES


@given(st.lists(st.sampled_from(OUTCOMES)))
def test_a_list_of_outcomes_the_server_takes_is_stated_as_asked_each_once(
    asked: list[str],
) -> None:
    # Each once, in the client's order: 4,000 names made an 88 KB ATTACH reply, past what a
    # client taking 512-byte frames reads (AMQP 1.0 §2.7.1).
    assert stated_outcomes(asked) == tuple(dict.fromkeys(asked))


def test_a_refusal_names_a_few_of_many_unsupported_outcomes() -> None:
    asked = [f"x:unknown-{n}" for n in range(4_000)]
    with pytest.raises(NotImplementedByServer) as refused:
        stated_outcomes(asked)
    text = str(refused.value)
    assert "x:unknown-0, x:unknown-1, x:unknown-2 and 3997 more" in text
    assert len(text) < 200


@given(st.lists(st.sampled_from(OUTCOMES)), st.text(min_size=1).filter(lambda s: s not in OUTCOMES))
def test_one_outcome_the_server_does_not_take_refuses_the_link(
    asked: list[str], other: str
) -> None:
    with pytest.raises(NotImplementedByServer, match="outcomes not supported") as refused:
        stated_outcomes([*asked, other])
    assert refused.value.condition == "amqp:not-implemented"
