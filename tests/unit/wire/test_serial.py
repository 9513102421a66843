"""RFC-1982 serial arithmetic on 32-bit delivery counts and the §2.6.7 credit formula."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd, serial_add, serial_diff

TOP = 2**32
serials = st.integers(min_value=0, max_value=TOP - 1)
# Distances that serial arithmetic can tell apart: |b| < 2**31.
distances = st.integers(min_value=-(2**31) + 1, max_value=2**31 - 1)


def test_mask_is_32_bits() -> None:
    assert SERIAL_MASK == TOP - 1


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (0, 0, 0),
        (1, 2, 3),
        (TOP - 1, 1, 0),
        (TOP - 1, 2, 1),
        (TOP - 4, 10, 6),
        (TOP - 5, 2_000_000_000, 2_000_000_000 - 5),
        (0, -1, TOP - 1),
        (5, -10, TOP - 5),
    ],
)
def test_serial_add_wraps(a: int, b: int, expected: int) -> None:
    assert serial_add(a, b) == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (0, 0, 0),
        (10, 3, 7),
        (3, 10, -7),
        (0, TOP - 1, 1),
        (TOP - 1, 0, -1),
        (5, TOP - 5, 10),
        (TOP - 5, 5, -10),
        (2**31 - 1, 0, 2**31 - 1),
        # Exactly half the space apart is undefined in RFC 1982; this module calls it negative.
        (2**31, 0, -(2**31)),
        (0, 2**31, -(2**31)),
    ],
)
def test_serial_diff_signed_across_the_wrap(a: int, b: int, expected: int) -> None:
    assert serial_diff(a, b) == expected


@pytest.mark.parametrize(
    ("dc_rcv", "credit_rcv", "dc_snd", "expected"),
    [
        (0, 10, 0, 10),
        (0, 10, 4, 6),
        (0, 10, 10, 0),
        # The receiver lowered its credit while 6 deliveries were in flight: floor of 0.
        (0, 2, 8, 0),
        (0, 0, 0, 0),
        # Stale delivery-count: 3 deliveries crossed the FLOW on the wire.
        (7, 5, 10, 2),
        # Wrap-around: the receiver's count is just below 2**32, the sender's just past 0.
        (TOP - 2, 5, 1, 2),
        (TOP - 10, 2_000_000_000, TOP - 10, 2_000_000_000),
        (TOP - 10, 2_000_000_000, 5, 2_000_000_000 - 15),
        # The sender is ahead of the receiver's limit across the wrap: floor of 0.
        (TOP - 10, 5, 3, 0),
        # link-credit is a uint: grants of 2**31 and up are credit, not a distance backwards.
        (0, TOP - 1, 0, TOP - 1),
        (TOP - 10, 2**31 + 5, 3, 2**31 + 5 - 13),
    ],
)
def test_link_credit_snd(dc_rcv: int, credit_rcv: int, dc_snd: int, expected: int) -> None:
    assert link_credit_snd(dc_rcv, credit_rcv, dc_snd) == expected


@given(serials, distances)
def test_diff_inverts_add(a: int, b: int) -> None:
    assert serial_diff(serial_add(a, b), a) == b


@given(serials, serials)
def test_add_of_diff_is_identity(a: int, b: int) -> None:
    assert serial_add(b, serial_diff(a, b)) == a


@given(serials, st.integers(min_value=-(2**40), max_value=2**40))
def test_add_stays_in_serial_space(a: int, b: int) -> None:
    result = serial_add(a, b)
    assert 0 <= result <= SERIAL_MASK
    assert result == (a + b) % TOP


@given(serials, serials)
def test_diff_is_antisymmetric_except_at_half(a: int, b: int) -> None:
    d = serial_diff(a, b)
    assert -(2**31) <= d < 2**31
    if d != -(2**31):
        assert serial_diff(b, a) == -d


@given(serials, st.integers(min_value=0, max_value=SERIAL_MASK), distances)
def test_link_credit_snd_matches_unbounded_arithmetic(
    dc_rcv: int, credit_rcv: int, offset: int
) -> None:
    """With the sender ``offset`` ahead of the receiver, credit is what is left, floored at 0."""
    dc_snd = serial_add(dc_rcv, offset)
    expected = credit_rcv - offset
    assert link_credit_snd(dc_rcv, credit_rcv, dc_snd) == max(0, expected)


@given(serials, st.integers(min_value=0, max_value=2**31 - 1))
def test_sending_uses_up_credit_one_by_one(dc: int, credit: int) -> None:
    """Each delivery advances the sender's count and costs exactly one credit."""
    sent = min(credit, 3)
    dc_snd = serial_add(dc, sent)
    assert link_credit_snd(dc, credit, dc_snd) == credit - sent
