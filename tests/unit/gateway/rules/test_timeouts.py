"""A connection's deadlines (gateway/rules/timeouts.py), driven without a socket or a clock."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.gateway.rules.timeouts import Deadlines


def _opened(
    now: float = 10.0, idle: float = 5.0, frames: int = 3, send_timeout: float = 0.0
) -> Deadlines:
    deadlines = Deadlines()
    deadlines.accepted(0.0, 30.0)
    assert deadlines.handshake_over()
    deadlines.opened(now, idle, frames, send_timeout)
    return deadlines


def test_the_handshake_is_overdue_at_its_deadline_and_counted_over_once() -> None:
    deadlines = Deadlines()
    deadlines.accepted(100.0, 30.0)
    assert deadlines.deadline == 130.0
    assert deadlines.overdue(129.9, reads_paused=False) is None
    assert deadlines.overdue(130.0, reads_paused=False) == "handshake"
    assert deadlines.handshake_over()
    assert not deadlines.handshake_over()


def test_only_a_whole_frame_makes_a_client_not_idle() -> None:
    deadlines = _opened(now=10.0, idle=5.0, frames=3)
    assert deadlines.deadline == 15.0
    deadlines.frames_read(14.0, 3)  # bytes of a frame, not finished
    assert deadlines.overdue(15.0, reads_paused=False) == "idle"
    deadlines.frames_read(14.5, 4)
    assert deadlines.overdue(15.0, reads_paused=False) is None
    assert deadlines.deadline == 19.5


def test_a_paused_client_is_not_idle_and_resuming_restarts_the_timeout() -> None:
    deadlines = _opened(now=10.0, idle=5.0)
    assert deadlines.overdue(40.0, reads_paused=True) is None
    assert deadlines.deadline == 45.0
    deadlines.resumed(50.0)
    assert deadlines.deadline == 55.0
    assert deadlines.overdue(54.0, reads_paused=False) is None
    assert deadlines.overdue(55.0, reads_paused=False) == "idle"


def test_the_credential_expiry_arms_the_earlier_deadline_and_a_renewal_replaces_it() -> None:
    deadlines = _opened(now=10.0, idle=5.0)
    deadlines.credential(10.0, 2.0)
    assert deadlines.deadline == 12.0
    assert deadlines.overdue(12.0, reads_paused=False) == "credential"
    deadlines.credential(12.0, None)
    assert deadlines.deadline == 15.0
    assert deadlines.overdue(14.0, reads_paused=False) is None
    deadlines.credential(14.0, -1.0)  # already expired: at once
    assert deadlines.overdue(14.0, reads_paused=False) == "credential"


def test_no_idle_timeout_and_no_credential_arm_nothing() -> None:
    deadlines = _opened(idle=0.0)
    assert deadlines.deadline == 0.0
    assert deadlines.overdue(1e9, reads_paused=False) is None
    assert deadlines.deadline == 0.0


@dataclass(frozen=True)
class _Step:
    elapsed: float
    frame: bool
    paused: bool


_steps = st.lists(
    st.builds(
        _Step,
        st.floats(min_value=0.0, max_value=4.0, allow_nan=False),
        st.booleans(),
        st.booleans(),
    ),
    max_size=40,
)


@given(_steps, st.floats(min_value=0.5, max_value=3.0), st.none() | st.floats(0.0, 60.0))
def test_the_idle_verdict_is_the_silence_since_the_last_frame_or_resume(
    steps: list[_Step], idle: float, expires_in: float | None
) -> None:
    """Whatever the order of frames, pauses and checks: a check says idle exactly when the
    client, while read, has sent no whole frame for ``idle`` seconds; otherwise the armed
    deadline is the earlier of that moment and the credential's expiry, never in the past."""
    # The reactor's clock is well past 0, which the deadlines use for "none".
    now, frames = 1000.0, 0
    deadlines = Deadlines()
    deadlines.accepted(now, 30.0)
    deadlines.handshake_over()
    deadlines.opened(now, idle, frames)
    deadlines.credential(now, expires_in)
    expiry = None if expires_in is None else now + expires_in
    last = now
    paused = False
    for step in steps:
        now += step.elapsed
        if paused and not step.paused:
            deadlines.resumed(now)
            last = now
        paused = step.paused
        if step.frame and not paused:
            frames += 1
            deadlines.frames_read(now, frames)
            last = now
        verdict = deadlines.overdue(now, reads_paused=paused)
        if expiry is not None and now >= expiry:
            assert verdict == "credential"
            return
        if not paused and now >= last + idle:
            assert verdict == "idle"
            return
        assert verdict is None
        due = now + idle if paused else last + idle
        expected = due if expiry is None else min(due, expiry)
        assert deadlines.deadline == expected
        assert deadlines.deadline > now


def test_a_client_whose_kernel_queue_does_not_go_down_is_stuck_at_the_send_timeout() -> None:
    deadlines = _opened(10.0, 60.0, 0, send_timeout=4.0)
    assert deadlines.deadline == 70.0
    deadlines.output(11.0, waiting=True)
    deadlines.output(12.0, waiting=True)  # still waiting: looked at from 11 on
    assert deadlines.deadline == 13.0
    assert deadlines.overdue(12.9, reads_paused=False) is None
    # Half the timeout without a write: the kernel's queue is looked at, and again later.
    assert deadlines.overdue(13.0, reads_paused=False) == "send"
    assert not deadlines.send_stuck(13.0, 3_000_000)
    assert deadlines.deadline == 15.0
    # The client read some of it: not stuck, looked at again.
    assert deadlines.overdue(15.0, reads_paused=False) == "send"
    assert not deadlines.send_stuck(15.0, 2_900_000)
    # Our own write adds to the queue: looked at afresh, half a timeout after it.
    deadlines.wrote(16.0)
    assert deadlines.overdue(17.0, reads_paused=False) is None
    assert deadlines.deadline == 18.0
    assert deadlines.overdue(18.0, reads_paused=False) == "send"
    assert not deadlines.send_stuck(18.0, 2_950_000)
    # Nothing read for half a timeout since: stuck.
    assert deadlines.overdue(20.0, reads_paused=True) == "send"
    assert deadlines.send_stuck(20.0, 2_950_000)


def test_output_that_stops_waiting_arms_no_send_check_and_none_without_a_send_timeout() -> None:
    deadlines = _opened(10.0, 0.0, 0, send_timeout=4.0)
    deadlines.output(11.0, waiting=True)
    deadlines.output(11.5, waiting=False)
    assert deadlines.overdue(13.0, reads_paused=False) is None
    assert deadlines.deadline == 0.0
    silent = _opened()
    silent.output(11.0, waiting=True)
    assert silent.overdue(1e6, reads_paused=False) == "idle"
    assert silent.send_check == 0.0


@dataclass(frozen=True)
class _Output:
    elapsed: float
    waiting: bool
    wrote: bool
    read: bool


@given(
    st.lists(
        st.builds(
            _Output,
            st.floats(min_value=0.0, max_value=2.0, allow_nan=False),
            st.booleans(),
            st.booleans(),
            st.booleans(),
        ),
        max_size=40,
    ),
    st.floats(min_value=0.5, max_value=3.0),
)
def test_a_client_is_stuck_only_once_it_read_nothing_for_half_the_send_timeout(
    steps: list[_Output], timeout: float
) -> None:
    """Whatever the order of output waiting, writes, reads and checks: a client is found
    stuck only when output waited, with no write and the kernel's queue not going down, for
    at least half the timeout; and while output waits, the kernel's queue is looked at no
    later than half a timeout after output began to wait, was written, or was last looked at."""
    now = 1000.0
    deadlines = _opened(now, 0.0, 0, send_timeout=timeout)
    queued = 1_000_000
    # While output waits: when it last moved (began to wait, was written, or was read), and
    # when the deadlines last learned of a move (all but a read) or looked.
    moved: float | None = None
    known = 0.0
    for step in steps:
        now += step.elapsed
        if moved is not None and step.wrote:
            queued += 100
            deadlines.wrote(now)
            moved = known = now
        if moved is not None and step.read:
            queued -= 50
            moved = now
        deadlines.output(now, step.waiting)
        if not step.waiting:
            moved = None
        elif moved is None:
            moved = known = now
        while deadlines.overdue(now, reads_paused=False) == "send":
            if deadlines.send_stuck(now, queued):
                assert moved is not None
                assert now - moved >= timeout / 2
                return
            known = now
        if moved is None:
            assert deadlines.deadline == 0.0
        else:
            assert now < deadlines.deadline <= known + timeout / 2
