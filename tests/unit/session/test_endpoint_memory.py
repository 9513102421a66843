"""The server's account of what connections, sessions and links hold (session/endpoint_memory.py):
nobody past the limit, and what connections hold beyond their allowance within the half they
share, so that clients within theirs still get in while others fill that half."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.session.endpoint_memory import ALLOWANCE, EXCESS_SHARE, EndpointMemory

KiB = 1024
LIMIT = 1024 * KiB


def test_within_its_allowance_a_connection_is_refused_only_at_the_limit() -> None:
    endpoints = EndpointMemory(LIMIT)
    hog = endpoints.change(0, LIMIT // EXCESS_SHARE + ALLOWANCE)
    assert endpoints.beyond == LIMIT // EXCESS_SHARE
    # The shared half is full: the hog gets nothing more, a small connection does.
    refusal = endpoints.refusal(hog, 1)
    assert refusal is not None
    assert "half of max_endpoints_size" in refusal
    assert endpoints.refusal(0, ALLOWANCE) is None
    # Small connections fill the rest, then the limit refuses everyone.
    small = [endpoints.change(0, ALLOWANCE) for _ in range((LIMIT - endpoints.held) // ALLOWANCE)]
    assert endpoints.held == LIMIT
    refusal = endpoints.refusal(0, 1)
    assert refusal is not None
    assert "max_endpoints_size allows" in refusal
    # What goes back is room again, for whoever it fits.
    endpoints.change(small[0], -small[0])
    assert endpoints.refusal(0, ALLOWANCE) is None
    endpoints.change(hog, -hog)
    assert endpoints.beyond == 0
    assert endpoints.refusal(0, LIMIT // EXCESS_SHARE) is None


def test_the_peak_is_the_most_held() -> None:
    endpoints = EndpointMemory(LIMIT)
    one = endpoints.change(0, 300 * KiB)
    endpoints.change(one, -one)
    endpoints.change(0, 100 * KiB)
    assert (endpoints.held, endpoints.peak) == (100 * KiB, 300 * KiB)


@given(
    st.lists(
        st.tuples(st.integers(0, 7), st.integers(-200 * KiB, 300 * KiB)),
        max_size=200,
    )
)
def test_taking_only_what_is_not_refused_keeps_both_bounds(steps: list[tuple[int, int]]) -> None:
    """Connections take what they are not refused and give back any part of what they hold:
    the sum never passes the limit, nor the part beyond allowances its half, and both are
    always what the holdings add up to."""
    endpoints = EndpointMemory(LIMIT)
    holdings = [0] * 8
    for index, size in steps:
        holding = holdings[index]
        if size < 0:
            size = max(size, -holding)
        elif endpoints.refusal(holding, size) is not None:
            continue
        holdings[index] = endpoints.change(holding, size)
        assert endpoints.held <= LIMIT
        assert endpoints.beyond <= LIMIT // EXCESS_SHARE
        assert endpoints.held == sum(holdings)
        assert endpoints.beyond == sum(max(0, h - ALLOWANCE) for h in holdings)
