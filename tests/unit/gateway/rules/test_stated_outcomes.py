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
def test_a_list_of_outcomes_the_server_takes_is_stated_as_asked(asked: list[str]) -> None:
    assert stated_outcomes(asked) == tuple(asked)


@given(st.lists(st.sampled_from(OUTCOMES)), st.text(min_size=1).filter(lambda s: s not in OUTCOMES))
def test_one_outcome_the_server_does_not_take_refuses_the_link(
    asked: list[str], other: str
) -> None:
    with pytest.raises(NotImplementedByServer, match="outcomes not supported") as refused:
        stated_outcomes([*asked, other])
    assert refused.value.condition == "amqp:not-implemented"
