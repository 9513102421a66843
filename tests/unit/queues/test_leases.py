"""Queue leases (``x-expires``) kept in a lazy heap agree with reading every lease, and the heap
stays within twice the leases however often queues are made, used and deleted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.leases import Leases

NAMES = ("a", "b", "c", "d")
Operation = tuple[str, str, int]
operations = st.lists(
    st.tuples(
        st.sampled_from(("grant", "release", "renew", "renew_all", "advance", "due")),
        st.sampled_from(NAMES),
        st.integers(1, 50),
    ),
    max_size=80,
)


@given(operations)
def test_the_heap_answers_as_a_reading_of_every_lease(steps: list[Operation]) -> None:
    leases = Leases()
    # The model: name -> (expires, last used).
    model: dict[str, tuple[int, int]] = {}
    now = 0
    for action, name, amount in steps:
        if action == "grant":
            leases.grant(name, amount, now)
            model[name] = (amount, now)
        elif action == "release":
            leases.release(name)
            model.pop(name, None)
        elif action == "renew":
            leases.renew(name, now)
            if name in model:
                model[name] = (model[name][0], now)
        elif action == "renew_all":
            leases.renew_all(now)
            model = {n: (expires, now) for n, (expires, _) in model.items()}
        elif action == "advance":
            now += amount
        else:
            due = sorted(leases.due(now))
            assert due == sorted(n for n, (e, used) in model.items() if used + e <= now)
        deadlines = [used + expires for expires, used in model.values()]
        assert leases.next_deadline() == (min(deadlines) if deadlines else None)


def test_queues_made_and_deleted_in_turn_leave_the_heap_within_twice_the_leases() -> None:
    leases = Leases()
    leases.grant("kept", 10_000, 0)
    for n in range(10_000):
        leases.grant("churned", 86_400_000, n)
        leases.release("churned")
    assert len(leases._heap) <= 2 * 1 + 64 + 1
    assert leases.next_deadline() == 10_000
    assert leases.due(10_000) == ["kept"]
    assert leases.due(10_000) == ["kept"], "due until released or renewed"
