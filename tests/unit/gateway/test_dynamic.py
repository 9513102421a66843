"""When a requester's Direct Reply-To replies are dropped (gateway/dynamic.py)."""

from __future__ import annotations

from sluicegate.gateway.dynamic import replies_backlogged
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.waiting import Waiting


def test_replies_are_dropped_at_the_connections_waiting_limit() -> None:
    waiting = Waiting(limit=1000)
    budget = MemoryBudget(limit=10_000)
    assert not replies_backlogged(waiting, budget)
    waiting.charge(999)
    assert not replies_backlogged(waiting, budget)
    waiting.charge(1)
    assert replies_backlogged(waiting, budget)
    waiting.charge(-1000)
    assert not replies_backlogged(waiting, budget)


def test_an_exhausted_budget_drops_replies_to_requesters_that_hold_any() -> None:
    waiting = Waiting(limit=1000)
    budget = MemoryBudget(limit=10_000)
    budget.update(10_000)
    assert budget.blocked
    # A requester that keeps up still gets its replies; one that holds some does not.
    assert not replies_backlogged(waiting, budget)
    waiting.charge(1)
    assert replies_backlogged(waiting, budget)
    budget.update(0)
    assert not replies_backlogged(waiting, budget)
