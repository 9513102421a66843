"""Writer credit toward sessions (RabbitMQ ``credit_flow``) and the handed/written ledger."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.writer.credit import (
    DEFAULT_INITIAL_CREDIT,
    DEFAULT_MORE_CREDIT_AFTER,
    SessionCredit,
)
from sluicegate.writer.writer import Writer, WriterStatistics


def blocked(credit: SessionCredit) -> bool:
    """Read ``blocked`` afresh (mypy would otherwise keep an earlier narrowing of the property)."""
    return credit.blocked


# -- SessionCredit -------------------------------------------------------------------------


def test_defaults_are_rabbitmq_credit_flow() -> None:
    credit = SessionCredit()
    assert (DEFAULT_INITIAL_CREDIT, DEFAULT_MORE_CREDIT_AFTER) == (400, 200)
    assert (credit.credit, credit.more_credit_after, credit.acked) == (400, 200, 0)
    assert not credit.blocked


@pytest.mark.parametrize(("initial", "more"), [(0, 1), (-1, 1), (10, 0), (10, 11), (10, -1)])
def test_invalid_configuration(initial: int, more: int) -> None:
    with pytest.raises(ValueError, match="more_credit_after"):
        SessionCredit(initial, more)


def test_blocks_at_zero() -> None:
    credit = SessionCredit(4, 2)
    for _ in range(3):
        credit.credit -= 1
        assert not credit.blocked
    credit.credit -= 1
    assert credit.credit == 0
    assert blocked(credit)


def test_bumps_in_multiples_of_more_credit_after() -> None:
    credit = SessionCredit(4, 2)
    credit.credit -= 4
    assert credit.ack(1) is False  # below the threshold: no bump yet
    assert (credit.credit, credit.acked) == (0, 1)
    assert credit.ack(1) is True  # 2 acked: a bump of 2 unblocks
    assert (credit.credit, credit.acked) == (2, 0)
    assert credit.ack(5) is False  # a bump of 4, remainder 1 kept; it was not blocked
    assert (credit.credit, credit.acked) == (6, 1)


def test_multi_frame_overdraw_and_recovery() -> None:
    """A message of many frames may go out on the last credit: it overdraws once, then blocks."""
    credit = SessionCredit(4, 2)
    credit.credit -= 3
    assert not credit.blocked
    credit.credit -= 10  # a 10-frame message handed over with 1 credit left
    assert credit.credit == -9
    assert blocked(credit)
    # A bump that leaves the credit at or below zero does not unblock.
    assert credit.ack(8) is False
    assert (credit.credit, credit.blocked) == (-1, True)
    assert credit.ack(1) is False
    assert credit.ack(1) is True  # the bump that crosses zero unblocks, once
    assert (credit.credit, credit.blocked) == (1, False)
    assert credit.ack(2) is False


spends_and_acks = st.lists(
    st.tuples(st.sampled_from(["spend", "ack"]), st.integers(min_value=1, max_value=30)),
    max_size=50,
)


@given(spends_and_acks)
def test_credit_is_conserved(operations: list[tuple[str, int]]) -> None:
    """credit + unbumped acks == initial - frames spent + frames acked, whatever the order."""
    credit = SessionCredit(20, 5)
    spent = acked = 0
    for operation, frames in operations:
        was_blocked = credit.blocked
        if operation == "spend":
            credit.credit -= frames
            spent += frames
        else:
            frames = min(frames, spent - acked)  # only frames handed over can be written
            unblocked = credit.ack(frames)
            acked += frames
            assert unblocked == (was_blocked and not credit.blocked)
        assert credit.credit + credit.acked == 20 - spent + acked
        assert 0 <= credit.acked < 5
    credit.ack(spent - acked)
    assert credit.credit + credit.acked == 20


# -- Writer ledger -------------------------------------------------------------------------


def test_ledger_acknowledges_in_fifo_order_when_bytes_cover_a_transfer() -> None:
    writer = Writer(initial_credit=10, more_credit_after=1)
    a = writer.session_credit()
    b = writer.session_credit()
    writer.handed(a, 1, 100)
    writer.handed(b, 2, 50)
    writer.handed(a, 1, 10)
    assert (a.credit, b.credit) == (8, 8)
    assert writer.statistics() == WriterStatistics(
        frames_pending=4, bytes_pending=160, bytes_written=0, sessions_blocked=0
    )
    assert writer.written(99) == []
    assert a.credit == 8  # 99 bytes do not cover the first transfer
    writer.written(1)
    assert (a.credit, b.credit) == (9, 8)
    writer.written(49)
    assert (a.credit, b.credit) == (9, 8)
    writer.written(60)
    assert (a.credit, b.credit) == (10, 10)
    assert writer.statistics() == WriterStatistics(
        frames_pending=0, bytes_pending=0, bytes_written=160, sessions_blocked=0
    )


def test_written_is_capped_at_handed() -> None:
    """Framing bytes run ahead of payload bytes; they must not pre-pay later transfers."""
    writer = Writer(initial_credit=10, more_credit_after=1)
    s = writer.session_credit()
    writer.handed(s, 1, 100)
    writer.written(1000)
    assert writer.statistics().bytes_written == 100
    assert writer.bytes_pending == 0
    writer.handed(s, 1, 100)
    assert s.credit == 9
    assert writer.written(0) == []
    assert s.credit == 9  # the earlier surplus was not kept
    writer.written(100)
    assert s.credit == 10


def test_unblocked_sessions_are_reported_once() -> None:
    writer = Writer(initial_credit=2, more_credit_after=1)
    s = writer.session_credit()
    other = writer.session_credit()
    writer.handed(s, 1, 10)
    writer.handed(s, 1, 10)
    writer.handed(other, 1, 10)
    assert s.blocked
    assert writer.statistics().sessions_blocked == 1
    # One call acknowledges both of s's transfers: s is reported once; other was never blocked.
    assert writer.written(30) == [s]
    assert writer.written(30) == []
    assert not s.blocked


def test_unblocked_after_a_multi_frame_overdraw() -> None:
    writer = Writer(initial_credit=4, more_credit_after=2)
    s = writer.session_credit()
    writer.handed(s, 3, 300)
    writer.handed(s, 5, 500)  # one credit left, a five-frame message: overdraw to -4
    assert s.credit == -4
    assert writer.written(300) == []  # 3 frames acked: a bump of 2, still -2
    assert (s.credit, s.acked) == (-2, 1)
    assert writer.written(500) == [s]  # 5 more: 6 acked, a bump of 6 → 4
    assert (s.credit, s.acked) == (4, 0)


def test_caught_up_accounts_for_what_proton_still_holds() -> None:
    writer = Writer(initial_credit=10, more_credit_after=1)
    s = writer.session_credit()
    for _ in range(3):
        writer.handed(s, 1, 100)
    assert s.credit == 7
    # The socket took everything but 100 bytes still inside proton's session buffers.
    writer.caught_up(100)
    assert s.credit == 9
    assert writer.bytes_pending == 100
    # Nothing behind: nothing changes.
    assert writer.caught_up(100) == []
    assert writer.caught_up(500) == []
    assert s.credit == 9
    writer.caught_up(0)
    assert s.credit == 10
    assert writer.statistics().frames_pending == 0


def test_caught_up_reports_unblocked_sessions() -> None:
    writer = Writer(initial_credit=1, more_credit_after=1)
    s = writer.session_credit()
    writer.handed(s, 1, 10)
    assert s.blocked
    assert writer.caught_up(0) == [s]


def test_zero_byte_transfer_is_acknowledged_by_the_next_write() -> None:
    writer = Writer(initial_credit=1, more_credit_after=1)
    s = writer.session_credit()
    writer.handed(s, 1, 0)
    assert s.blocked
    assert writer.written(0) == [s]
    assert writer.statistics().frames_pending == 0


def test_caught_up_acknowledges_a_zero_byte_transfer() -> None:
    writer = Writer(initial_credit=1, more_credit_after=1)
    s = writer.session_credit()
    writer.handed(s, 1, 0)
    assert writer.caught_up(0) == [s]
    assert writer.statistics().frames_pending == 0


def test_handed_says_the_room_left_and_none_once_full_until_half_is_written() -> None:
    writer = Writer(max_bytes=1000)
    s = writer.session_credit()
    assert writer.handed(s, 1, 600) == 400 == writer.room
    assert writer.handed(s, 1, 500) == 0 == writer.room
    assert writer.full
    writer.written(200)
    # Still full: 900 bytes wait, more than half the maximum.
    assert writer.handed(s, 1, 0) == 0 == writer.room
    writer.written(500)
    assert writer.handed(s, 1, 100) == 500 == writer.room


def test_forget_keeps_draining_the_ledger() -> None:
    writer = Writer(initial_credit=1, more_credit_after=1)
    s = writer.session_credit()
    writer.handed(s, 1, 10)
    writer.forget(s)
    assert writer.statistics().sessions_blocked == 0
    writer.written(10)
    assert writer.statistics().frames_pending == 0
    assert not s.blocked


# A random conversation between three sessions and the IO layer.
writer_operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("handed"),
            st.integers(min_value=0, max_value=2),
            st.integers(min_value=1, max_value=4),
            # Zero-byte transfers too: see test_caught_up_acknowledges_a_zero_byte_transfer.
            st.integers(min_value=0, max_value=3000),
        ),
        st.tuples(
            st.just("written"), st.just(0), st.just(0), st.integers(min_value=0, max_value=4000)
        ),
        st.tuples(
            st.just("caught_up"), st.just(0), st.just(0), st.integers(min_value=0, max_value=4000)
        ),
    ),
    max_size=60,
)


@given(writer_operations)
def test_ledger_model(operations: list[tuple[str, int, int, int]]) -> None:
    writer = Writer(initial_credit=8, more_credit_after=3)
    sessions = [writer.session_credit() for _ in range(3)]
    entries: list[tuple[int, int, int]] = []  # (cumulative handed bytes, session, frames)
    handed = written = 0
    for operation, index, frames, nbytes in operations:
        blocked_before = [s.blocked for s in sessions]
        if operation == "handed":
            if sessions[index].blocked:
                continue  # a blocked session does not hand over transfers
            # What the writer says is left is its room, as a session reads it after.
            assert writer.handed(sessions[index], frames, nbytes) == writer.room
            handed += nbytes
            entries.append((handed, index, frames))
            continue
        if operation == "written":
            unblocked = writer.written(nbytes)
            written = min(written + nbytes, handed)
        else:
            unblocked = writer.caught_up(nbytes)
            written = max(written, handed - nbytes)
        # Exactly the sessions this call unblocked, each once.
        assert len(unblocked) == len({id(s) for s in unblocked})
        expected = [
            s for s, was in zip(sessions, blocked_before, strict=True) if was and not s.blocked
        ]
        assert {id(s) for s in unblocked} == {id(s) for s in expected}
        stats = writer.statistics()
        assert stats.bytes_written == written <= handed
        assert stats.bytes_pending == handed - written
        # A transfer is acknowledged once the bytes written cover it, in handing order.
        pending = [e for e in entries if e[0] > written]
        assert stats.frames_pending == sum(f for _, _, f in pending)
        assert stats.sessions_blocked == sum(1 for s in sessions if s.blocked)
        for index, session in enumerate(sessions):
            spent = sum(f for _, i, f in entries if i == index)
            acked = sum(f for c, i, f in entries if i == index and c <= written)
            assert session.credit + session.acked == 8 - spent + acked
