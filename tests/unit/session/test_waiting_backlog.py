"""When a connection's unsent deliveries make it backlogged (session/waiting.py): what adds to
them without a queue's credit (Direct Reply-To replies, management replies) is then dropped."""

from __future__ import annotations

from sluicegate.session.waiting import Waiting


def test_a_connection_is_backlogged_at_its_waiting_limit() -> None:
    waiting = Waiting(limit=1000)
    assert not waiting.backlogged(False)
    waiting.charge(999)
    assert not waiting.backlogged(False)
    waiting.charge(1)
    assert waiting.backlogged(False)
    waiting.charge(-1000)
    assert not waiting.backlogged(False)
    assert waiting.server.total == 0


def test_an_exhausted_budget_backlogs_connections_that_hold_anything() -> None:
    waiting = Waiting(limit=1000)
    # A connection that keeps up still gets its replies; one that holds some does not.
    assert not waiting.backlogged(True)
    waiting.charge(1)
    assert waiting.backlogged(True)
    assert not waiting.backlogged(False)
