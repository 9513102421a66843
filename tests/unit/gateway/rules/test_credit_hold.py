"""The hold on credit granted with a consumer's ATTACH (gateway/rules/credit_hold.py), driven
without a socket or a clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.gateway.rules.credit_hold import CreditHold


def test_nothing_held_has_no_deadline_and_releases_nothing() -> None:
    hold: CreditHold[str] = CreditHold()
    assert not hold
    assert hold.deadline == 0.0
    assert hold.heard(7) == []
    assert hold.due(1e9) == []


def test_a_frame_decoded_after_the_hold_began_releases_every_link() -> None:
    hold: CreditHold[str] = CreditHold()
    assert hold.hold("a", now=10.0, hold=0.05, frames=4)
    assert hold.hold("b", now=10.01, hold=0.05, frames=4)
    assert hold.deadline == 10.05
    assert hold.heard(4) == []  # bytes of a frame, not finished: the client may not have read
    assert hold.heard(5) == ["a", "b"]
    assert not hold
    assert hold.deadline == 0.0


def test_each_hold_ends_on_its_own_deadline_oldest_first() -> None:
    hold: CreditHold[str] = CreditHold()
    hold.hold("a", now=10.0, hold=0.05, frames=4)
    hold.hold("b", now=10.03, hold=0.05, frames=4)
    assert hold.due(10.049) == []
    assert hold.due(10.05) == ["a"]
    assert hold.deadline == 10.08
    assert hold.due(11.0) == ["b"]
    assert not hold


def test_a_hold_of_zero_holds_nothing() -> None:
    hold: CreditHold[str] = CreditHold()
    assert not hold.hold("a", now=10.0, hold=0.0, frames=4)
    assert not hold


def test_clear_forgets_every_link() -> None:
    hold: CreditHold[str] = CreditHold()
    hold.hold("a", now=10.0, hold=0.05, frames=4)
    hold.clear()
    assert not hold
    assert hold.heard(9) == []


@given(
    st.lists(
        st.tuples(st.sampled_from(["hold", "frame", "tick"]), st.floats(0.0, 0.2)),
        max_size=40,
    )
)
def test_every_link_held_is_released_once_and_never_before_a_frame_or_its_deadline(
    steps: list[tuple[str, float]],
) -> None:
    hold: CreditHold[int] = CreditHold()
    now, frames, hold_time = 0.0, 0, 0.05
    began: dict[int, tuple[float, int]] = {}
    released: list[int] = []
    for step, delay in steps:
        now += delay
        if step == "hold":
            link = len(began)
            began[link] = (now, frames)
            assert hold.hold(link, now, hold_time, frames)
            continue
        if step == "frame":
            frames += 1
            out = hold.heard(frames)
        else:
            out = hold.due(now)
        for link in out:
            start, seen = began[link]
            assert frames > seen or now >= start + hold_time
        released += out
    released += hold.heard(frames + 1)
    assert sorted(released) == list(began)
