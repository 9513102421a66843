"""The checks at either end of the channel, case by case: what a peer that breaks the protocol
gets (ChannelError, the channel ends), and what a consumer of a missing queue gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import QueueType
from sluicegate.session.channel.codec import DELIVERY_ENTRY_SIZE, ChannelError
from sluicegate.session.channel.ends import Confirms, Publishes, QueueEnd, SessionEnd
from sluicegate.session.channel.frames import (
    Attach,
    Confirm,
    Credit,
    CreditReply,
    Deliveries,
    Detach,
    Error,
    Settle,
    Settled,
)
from sluicegate.session.channel.owner import Owner


def _owner(queue: ClassicQueue) -> Owner:
    queues: dict[str, QueueType] = {"q": queue}
    return Owner(lambda vhost, name: queues.get(name) if vhost == "/" else None, 4)


def test_a_consumer_of_a_missing_queue_gets_not_found_and_a_garbled_filter_set_ends() -> None:
    owner = _owner(ClassicQueue("q"))
    assert owner.receive(Attach(1, "/", "nope", True, False, 0)) == (
        [Error(1, "amqp:not-found", "no queue 'nope' in vhost '/'")],
        [],
    )
    with pytest.raises(ChannelError, match="filter set"):
        owner.receive(Attach(2, "/", "q", True, False, 0, b"\x00S"))
    assert owner.consumers == {}


def test_a_second_attach_of_one_consumer_or_a_frame_for_none_ends_the_channel() -> None:
    owner = _owner(ClassicQueue("q"))
    owner.receive(Attach(1, "/", "q", True, False, 0))
    with pytest.raises(ChannelError, match="attached twice"):
        owner.receive(Attach(1, "/", "q", True, False, 0))
    with pytest.raises(ChannelError, match="not attached"):
        owner.receive(Credit(9, 0, 5, False, False))
    with pytest.raises(ChannelError, match="CreditReply frame sent to a queue's owner"):
        owner.receive(CreditReply(1, 0, 0, 0, False, False))


def test_a_settlement_names_no_more_than_the_consumer_holds() -> None:
    queue = ClassicQueue("q")
    owner = _owner(queue)
    for _ in range(3):
        queue.enqueue(Message(b"m"))
    owner.receive(Attach(1, "/", "q", True, False, 0))
    frames, _ = owner.receive(Credit(1, 0, 3, False, False))
    assert isinstance(frames[0], Deliveries)
    assert frames[0].seqs == (0, 1, 2)
    # A range of 2**40 deliveries: refused before it is walked.
    with pytest.raises(ChannelError, match="settlement of 1099511627776 deliveries, 3"):
        owner.receive(Settle(1, Settled.ACCEPTED, ((0, 2**40 - 1),)))
    owner.receive(Settle(1, Settled.ACCEPTED, ((0, 1),)))
    assert queue.statistics().acknowledged == 2


@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12), limit=st.integers(1, 700))
def test_a_credits_worth_of_deliveries_crosses_in_frames_the_other_reader_takes(
    sizes: list[int], limit: int
) -> None:
    """A credit's worth of large messages in one DELIVERIES frame was over the largest frame
    the other worker reads (the largest message and FRAME_OVERHEAD): the channel ended, and
    every remote consumer with it. A run is split into frames within the limit, each holding
    at least one message (a message never exceeds it), in order; a run within it is one."""
    queue = ClassicQueue("q")
    owner = _owner(queue)
    owner.max_deliveries_size = limit
    for size in sizes:
        queue.enqueue(Message(b"m" * size))
    owner.receive(Attach(1, "/", "q", True, False, 0))
    frames, _ = owner.receive(Credit(1, 0, len(sizes), False, False))
    runs = [frame for frame in frames if isinstance(frame, Deliveries)]
    assert [len(p) for run in runs for p in run.payloads] == sizes
    assert [seq for run in runs for seq in run.seqs] == list(range(len(sizes)))
    for run in runs:
        assert run.payloads
        cost = sum(len(payload) + DELIVERY_ENTRY_SIZE for payload in run.payloads)
        assert cost <= limit or len(run.payloads) == 1
    if sum(sizes) + DELIVERY_ENTRY_SIZE * len(sizes) <= limit:
        assert len(runs) == 1


def test_the_owner_refuses_to_send_more_than_the_request_granted() -> None:
    end = QueueEnd(1, ack_required=False)
    end.granted(Credit(1, 0, 2, False, False))
    end.sending(2)
    with pytest.raises(ChannelError, match="would send 1 on a credit of 0"):
        end.sending(1)


def test_the_session_refuses_deliveries_beyond_its_credit_and_replies_it_did_not_ask() -> None:
    end = SessionEnd(1)
    with pytest.raises(ChannelError, match="a credit reply with no request"):
        end.replied(CreditReply(1, 0, 0, 0, False, False))
    assert end.request(2, False, False) == Credit(1, 0, 2, False, False)
    end.delivered(2)
    with pytest.raises(ChannelError, match="1 deliveries on a credit of 0"):
        end.delivered(1)
    with pytest.raises(ChannelError, match="a reply at delivery-count 9"):
        end.replied(CreditReply(1, 9, 0, 0, True, False))


def test_a_flow_while_a_request_is_out_is_stashed_newest_first_and_sent_on_the_reply() -> None:
    end = SessionEnd(1)
    assert end.request(4, False, False) is not None
    assert end.request(1, False, False) is None
    assert end.request(3, True, True) is None
    assert end.replied(CreditReply(1, 0, 4, 0, False, False)) == Credit(1, 0, 3, True, True)
    assert end.in_flight
    assert end.stashed is None


def test_a_detach_gives_back_what_the_session_held_and_what_crossed_it() -> None:
    queue = ClassicQueue("q")
    owner = _owner(queue)
    owner.receive(Attach(1, "/", "q", False, False, 0))
    owner.receive(Credit(1, 0, 4, False, False))
    for _ in range(4):
        owner.route(queue.enqueue(Message(b"m")))
    # The session saw two deliveries, sent one to its client, holds the other; two crossed.
    owner.receive(Detach(1, 2, (1,)))
    assert queue.statistics().ready == 3


def test_a_remote_consumers_recent_deliveries_cover_its_last_two_requests_and_no_more() -> None:
    queue = ClassicQueue("q")
    # Twice a local batch of 4: at least 8 kept.
    owner = _owner(queue)
    owner.receive(Attach(1, "/", "q", False, False, 0))
    owner.receive(Credit(1, 0, 16, False, False))
    for _ in range(16):
        owner.route(queue.enqueue(Message(b"m")))
    # Nothing left the session yet: counted from there, 16 more may come.
    owner.receive(Credit(1, 0, 32, False, False))
    for _ in range(16):
        owner.route(queue.enqueue(Message(b"m")))
    # A batch larger than twice a local one, all of it kept for a detach.
    assert owner.recent_bytes == 32
    # Its requests fall to one delivery at a time: twice a local batch is kept, and the
    # pre-settled bytes of the rest, counted here only, are let go.
    owner.receive(Credit(1, 32, 1, False, False))
    assert owner.recent_bytes == 32
    owner.receive(Credit(1, 32, 1, False, False))
    assert owner.recent_bytes == 8
    owner.receive(Detach(1, 32, tuple(range(24, 32))))
    assert queue.statistics().ready == 8
    assert owner.recent_bytes == 0


def test_a_lost_channel_returns_unsettled_deliveries_and_sends_nothing_twice() -> None:
    queue = ClassicQueue("q")
    owner = _owner(queue)
    owner.receive(Attach(1, "/", "q", True, False, 0))
    owner.receive(Attach(2, "/", "q", False, False, 0))
    for _ in range(4):
        queue.enqueue(Message(b"m"))
    owner.receive(Credit(1, 0, 2, False, False))
    owner.receive(Credit(2, 0, 2, False, False))
    assert owner.close() == []
    assert owner.consumers == {}
    # The two unsettled come back; the two sent at most once are gone.
    assert queue.statistics().ready == 2


def test_a_confirm_renews_only_what_it_names_and_never_an_id_not_sent() -> None:
    publishes: Publishes[str] = Publishes()
    ids = [publishes.sent(name) for name in "abc"]
    assert publishes.confirmed(Confirm(ids[0], ids[1], Settled.ACCEPTED)) == ["a", "b"]
    with pytest.raises(ChannelError, match="not all sent and waiting"):
        publishes.confirmed(Confirm(ids[0], ids[2], Settled.ACCEPTED))
    with pytest.raises(ChannelError, match="not all sent and waiting"):
        publishes.confirmed(Confirm(ids[2], 2**63, Settled.ACCEPTED))
    assert publishes.lost() == ["c"]
    assert publishes.unconfirmed == {}


def test_credit_counted_from_a_session_behind_counts_what_waits_in_it() -> None:
    end = SessionEnd(1)
    assert end.request(4, False, False) is not None
    end.delivered(4)
    assert end.replied(CreditReply(1, 4, 0, 0, False, False)) is None
    # Three of the four still wait in the session: a credit of 5 from 1 leaves 2 to send.
    assert end.request(5, False, False, delivery_count=1) == Credit(1, 1, 5, False, False)
    assert end.credit == 2
    ahead = SessionEnd(3)
    with pytest.raises(ValueError, match="credit counted from 9, ahead of the 0 seen"):
        ahead.request(1, False, False, delivery_count=9)


# A publish's confirm as the owner makes it: its id, outcome, and an error condition or "".
_CONFIRMED = st.tuples(
    st.integers(1, 40), st.sampled_from(Settled), st.sampled_from(["", "amqp:x"])
)


@given(st.lists(st.lists(_CONFIRMED, max_size=12), max_size=4))
def test_confirms_merged_into_runs_say_what_each_publish_got_in_order(
    flushes: list[list[tuple[int, Settled, str]]],
) -> None:
    confirms = Confirms()
    for added in flushes:
        for publish, outcome, condition in added:
            confirms.add(publish, outcome, condition, condition and "why")
        frames = confirms.take()
        expanded = [
            (publish, frame.outcome, frame.condition)
            for frame in frames
            for publish in range(frame.first, frame.last + 1)
        ]
        assert expanded == added
        # As few frames as there are breaks: an error, another outcome, an id out of turn.
        breaks = sum(
            1
            for before, (publish, outcome, condition) in zip([None, *added], added, strict=False)
            if before is None
            or condition
            or before[2]
            or outcome is not before[1]
            or publish != before[0] + 1
        )
        assert len(frames) == breaks
        assert all(frame.first <= frame.last for frame in frames)
    assert confirms.take() == []


def test_a_flush_of_confirms_stored_in_order_is_one_frame() -> None:
    confirms = Confirms()
    for publish in range(5, 105):
        confirms.add(publish, Settled.ACCEPTED)
    assert confirms.take() == [Confirm(5, 104, Settled.ACCEPTED)]
    confirms.add(105, Settled.ACCEPTED)
    confirms.add(106, Settled.REJECTED, "amqp:resource-limit-exceeded", "full")
    confirms.add(107, Settled.ACCEPTED)
    assert confirms.take() == [
        Confirm(105, 105, Settled.ACCEPTED),
        Confirm(106, 106, Settled.REJECTED, "amqp:resource-limit-exceeded", "full"),
        Confirm(107, 107, Settled.ACCEPTED),
    ]


# A step of the owner's confirms: one publish added, or (True) a run of as many ids as the
# third field says accepted at once from the publish's id.
_STEP = st.tuples(st.booleans(), _CONFIRMED, st.integers(0, 12))


@given(st.lists(_STEP, max_size=12))
def test_a_run_accepted_at_once_makes_the_frames_its_adds_one_by_one_make(
    steps: list[tuple[bool, tuple[int, Settled, str], int]],
) -> None:
    at_once, one_by_one = Confirms(), Confirms()
    for run, (publish, outcome, condition), length in steps:
        if run:
            at_once.accepted(publish, publish + length - 1)
            for each in range(publish, publish + length):
                one_by_one.add(each, Settled.ACCEPTED)
        else:
            at_once.add(publish, outcome, condition, condition and "why")
            one_by_one.add(publish, outcome, condition, condition and "why")
    assert at_once.take() == one_by_one.take()
