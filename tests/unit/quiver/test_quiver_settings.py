"""Checking the options together and planning the sender and receiver processes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.clients.quiver.endpoint import parse_url
from sluicegate.clients.quiver.settings import Settings, SettingsError, plan_arrows, shares

URL = "amqp://127.0.0.1:5700/q"


def settings(**overrides: object) -> Settings:
    fields: dict[str, object] = {"url": URL, "endpoint": parse_url(URL), "count": 10}
    fields.update({"duration": None} | overrides)
    return Settings(**fields)  # type: ignore[arg-type]


def test_shares_give_the_remainder_to_the_first() -> None:
    assert shares(10, 3) == [4, 3, 3]
    assert shares(2000, 1) == [2000]


@given(st.integers(0, 10**9), st.integers(1, 64))
def test_shares_add_up_and_differ_by_one_at_most(total: int, parts: int) -> None:
    split = shares(total, parts)
    assert sum(split) == total
    assert len(split) == parts
    assert max(split) - min(split) <= 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"count": None}, "exactly one"),
        ({"duration": 5.0}, "exactly one"),
        ({"count": 0}, "at least 1"),
        ({"count": None, "duration": 0.0}, "positive"),
        ({"body_size": 7}, "at least 8"),
        ({"credit": 0}, "--credit"),
        ({"timeout": 0.0}, "--timeout"),
        ({"senders": 0}, "--senders"),
        ({"count": 2, "senders": 3}, "each sender"),
        ({"peer_to_peer": True, "senders": 2}, "as many of each"),
    ],
)
def test_contradictions_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        settings(**overrides)


def test_flags_in_quiver_wording() -> None:
    assert settings().flags == ()
    flags = settings(durable=True, presettled=True, peer_to_peer=True).flags
    assert flags == ("durable", "presettled", "peer-to-peer")


def test_plan_through_a_server() -> None:
    senders, receivers = plan_arrows(settings(count=10, senders=3, receivers=2), 123)
    assert [s.count for s in senders] == [4, 3, 3]
    assert [r.count for r in receivers] == [10, 10]  # the most any one receiver may take
    assert {(a.host, a.port, a.address, a.listen) for a in senders + receivers} == {
        ("127.0.0.1", 5700, "q", False)
    }
    assert [a.name for a in senders + receivers] == [
        "sender 1", "sender 2", "sender 3", "receiver 1", "receiver 2",
    ]  # fmt: skip
    assert {a.not_before_ns for a in senders + receivers} == {123}


def test_plan_peer_to_peer_pairs_ports() -> None:
    senders, receivers = plan_arrows(
        settings(count=11, senders=2, receivers=2, peer_to_peer=True), 0
    )
    assert [(s.port, s.count, s.listen) for s in senders] == [(5700, 6, False), (5701, 5, False)]
    assert [(r.port, r.count, r.listen) for r in receivers] == [(5700, 6, True), (5701, 5, True)]


def test_plan_for_a_duration() -> None:
    senders, receivers = plan_arrows(settings(count=None, duration=2.5), 0)
    assert (senders[0].count, senders[0].duration) == (None, 2.5)
    assert (receivers[0].count, receivers[0].duration) == (None, None)
