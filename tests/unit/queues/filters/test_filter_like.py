"""LIKE patterns: the linear matcher agrees with a regular-expression reference, and patterns that
make a backtracking matcher take exponential time are answered at once."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.like import LikePattern


def _reference(pattern: str, escape: str | None) -> re.Pattern[str]:
    """LIKE as a regular expression: fine for a reference on short subjects."""
    parts: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            parts.append(re.escape(next(chars)))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


# A small alphabet makes matches common; "!" is the escape character when one is used.
_PATTERN_CHARS = st.sampled_from(["a", "b", "%", "_", "!", "\n", "é"])
_SUBJECTS = st.text(alphabet=st.sampled_from(["a", "b", "%", "_", "!", "\n", "é"]), max_size=12)


@given(
    pattern=st.lists(_PATTERN_CHARS, max_size=10).map("".join),
    subject=_SUBJECTS,
    escaped=st.booleans(),
)
def test_like_agrees_with_a_regular_expression(pattern: str, subject: str, escaped: bool) -> None:
    escape = "!" if escaped else None
    try:
        like = LikePattern(pattern, escape)
    except InvalidFilter:
        # Only a pattern that ends with an unescaped escape character is refused.
        assert escape is not None
        assert pattern.endswith("!")
        return
    expected = _reference(pattern, escape).fullmatch(subject) is not None
    assert like(subject) is expected


@given(subject=_SUBJECTS, prefix=_SUBJECTS, suffix=_SUBJECTS)
def test_a_matching_subject_matches_with_any_run_for_each_percent(
    subject: str, prefix: str, suffix: str
) -> None:
    literal = subject.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    assert LikePattern(literal, "!")(subject)
    assert LikePattern("%" + literal + "%", "!")(prefix + subject + suffix)


@pytest.mark.parametrize(
    "pattern", ["%a%a%a%a%a%a%a%a%b", "%a_a%a_a%a_a%a_a%b", "%" + "a%" * 200 + "b", "a" * 50 + "%b"]
)
def test_patterns_that_backtrack_exponentially_are_answered_at_once(pattern: str) -> None:
    # A backtracking matcher takes hours on these; the test's timeout would catch it.
    assert not LikePattern(pattern)("a" * 100_000)
    assert LikePattern(pattern)("a" * 100_000 + "b")


def test_escape_must_be_one_character_and_not_end_the_pattern() -> None:
    with pytest.raises(InvalidFilter, match="single character"):
        LikePattern("a", "!!")
    with pytest.raises(InvalidFilter, match="ends with"):
        LikePattern("50!", "!")
