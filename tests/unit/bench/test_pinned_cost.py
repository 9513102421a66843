"""``python -m bench.channel_cost --pinned`` reaches the worker it asks for and measures every
round of a case against a real server of two workers."""

from __future__ import annotations

import pytest

from bench.pinned_cost import Case, _accepted_by, measure, pinned, serving


@pytest.mark.slow
def test_a_pinned_connection_is_served_by_the_worker_asked_for() -> None:
    with serving(2) as (server, pids):
        for wanted in reversed(pids):
            pump = pinned(server, pids, wanted, "pinned-test")
            try:
                assert _accepted_by(server.port, pump.sock.getsockname()[1], pids) == wanted
            finally:
                pump.close()


@pytest.mark.slow
def test_every_round_of_a_crossing_case_moves_its_messages_and_is_measured() -> None:
    costs = measure(Case("crossing", 2, 1), 200, 2)
    assert len(costs) == 2
    assert all(cost.publish >= 0 and cost.consume >= 0 for cost in costs)
