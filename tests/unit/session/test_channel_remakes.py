"""When the supervisor makes a channel again after a protocol error (session/channel/remakes.py,
docs/workers.md): a pause doubled at each error in a row, late reports ignored."""

from __future__ import annotations

from sluicegate.session.channel.remakes import FIRST_PAUSE, MAX_PAUSE, Remakes, pair_of


def test_a_broken_channel_is_made_again_after_a_pause_doubled_at_each_error_in_a_row() -> None:
    remakes = Remakes()
    pair = pair_of(1, 0)
    assert pair == (0, 1)
    serial = remakes.made(pair, 0.0)
    now = 0.0
    pauses = []
    for _ in range(9):
        pause = remakes.broken(pair, serial, now)
        assert pause is not None
        pauses.append(pause)
        assert remakes.due(now + pause - 0.01) == []
        now += pause
        assert remakes.due(now) == [pair]
        serial = remakes.made(pair, now)
        assert remakes.due(now) == []
    assert pauses == [FIRST_PAUSE * 2**n for n in range(6)] + [MAX_PAUSE] * 3


def test_a_channel_that_served_a_while_before_it_broke_starts_a_new_run() -> None:
    remakes = Remakes()
    pair = (0, 2)
    serial = remakes.made(pair, 0.0)
    assert remakes.broken(pair, serial, 1.0) == FIRST_PAUSE
    serial = remakes.made(pair, 1.5)
    assert remakes.broken(pair, serial, 2.0) == 2 * FIRST_PAUSE
    serial = remakes.made(pair, 3.0)
    assert remakes.broken(pair, serial, 3.0 + MAX_PAUSE) == FIRST_PAUSE


def test_a_report_of_an_older_channel_or_a_second_report_changes_nothing() -> None:
    remakes = Remakes()
    pair = (0, 1)
    old = remakes.made(pair, 0.0)
    # The worker was restarted meanwhile: its fresh channel is not made again.
    current = remakes.made(pair, 1.0)
    assert remakes.broken(pair, old, 2.0) is None
    assert remakes.due(100.0) == []
    # Both workers report the same channel: one remake.
    assert remakes.broken(pair, current, 2.0) == FIRST_PAUSE
    assert remakes.broken(pair, current, 2.1) is None
    assert remakes.due(2.5) == [pair]
    # A pair with a worker that is not running: cancelled, its fork makes the channel.
    remakes.cancel(pair)
    assert remakes.due(100.0) == []
    # A pair that never had a channel is no pair to remake.
    assert remakes.broken((1, 2), 1, 0.0) is None


def test_serials_are_unique_across_pairs() -> None:
    remakes = Remakes()
    serials = {remakes.made(pair, 0.0) for pair in [(0, 1), (0, 2), (1, 2), (0, 1)]}
    assert len(serials) == 4
