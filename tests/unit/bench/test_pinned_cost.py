"""``python -m bench.channel_cost --pinned`` reaches the worker it asks for, measures every
round of its cases in turns against real servers, and takes each ratio within a round."""

from __future__ import annotations

import pytest

from bench.pinned_cost import Case, _accepted_by, measure, pinned, ratios, serving


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
def test_every_round_of_every_case_moves_its_messages_and_is_measured() -> None:
    local, crossing = Case("local", 1, 0), Case("crossing", 2, 1)
    costs = measure((local, crossing), 200, 3)
    assert list(costs) == [local, crossing]
    assert all(len(rounds) == 3 for rounds in costs.values())
    assert all(cost.publish >= 0 and cost.consume >= 0 for cost in costs[crossing])


def test_a_ratio_is_taken_within_each_round() -> None:
    # A round whose load doubled both sides keeps its ratio: 2.0 / 1.0 and 4.0 / 2.0.
    assert ratios([2.0, 4.0, 3.0], [1.0, 2.0, 2.0]) == (2.0, 1.5, 2.0)
