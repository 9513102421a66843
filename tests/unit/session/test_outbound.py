"""The session's dual link, example by example (docs/outbound-flow-control.md; the scenarios
are RabbitMQ's amqp_client_SUITE's).

A real :class:`ClassicQueue`, a :class:`Writer` and a :class:`Session` are wired together in
memory. The queue records every credit request so the tests can count batches, the way the
RabbitMQ suite reads ``ready_messages(Q)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import ConsumerKey, CreditReply, Outcome
from sluicegate.session.outbound import (
    DEFAULT_MAX_QUEUE_CREDIT,
    Action,
    LinkFlow,
    Session,
    Transfer,
    TransferPart,
    route,
)
from sluicegate.session.outgoing_link import CreditReq, OutgoingLink, granted_credit
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import read_header
from sluicegate.wire.serial import SERIAL_MASK, serial_add
from sluicegate.writer.writer import Writer


@dataclass(frozen=True)
class CreditCall:
    consumer: ConsumerKey
    delivery_count: int
    credit: int
    drain: bool
    delivered: int
    reply: CreditReply


class RecordingQueue(ClassicQueue):
    """A classic queue that records each credit request it answers."""

    def __init__(self, name: str = "q") -> None:
        super().__init__(name)
        self.calls: list[CreditCall] = []

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        delivered, reply = super().credit(consumer, delivery_count, credit, drain)
        self.calls.append(
            CreditCall(consumer, delivery_count, credit, drain, len(delivered), reply)
        )
        return delivered, reply


def _payload(i: int, size: int = 0) -> bytes:
    return encode(Described(0x77, f"m{i}" + "x" * size))


class Harness:
    """Client, session, writer and queue in one process; the client tracks its delivery-count."""

    def __init__(
        self,
        messages: int = 0,
        *,
        window: int = 1_000_000,
        ack_required: bool = False,
        writer: Writer | None = None,
        max_frame_size: int = 65536,
        payload_size: int = 0,
    ) -> None:
        self.queue = RecordingQueue()
        self.writer = writer if writer is not None else Writer()
        self.session = Session(
            self.writer, remote_incoming_window=window, max_frame_size=max_frame_size
        )
        self.link = self.session.attach_link(0, self.queue, ack_required=ack_required)
        self.payload_size = payload_size
        self.enqueued = 0
        # What the client has seen: its delivery-count and every action in order.
        self.client_dc = 0
        self.received: list[Message] = []
        self.actions: list[Action] = []
        self.enqueue(messages)

    def enqueue(self, count: int) -> None:
        for _ in range(count):
            dispatches = self.queue.enqueue(Message(_payload(self.enqueued, self.payload_size)))
            self.enqueued += 1
            route(dispatches)

    def flow(
        self, credit: int, *, drain: bool = False, echo: bool = False, dc: int | None = None
    ) -> None:
        self.session.client_flow(
            self.link, self.client_dc if dc is None else dc, credit, drain, echo
        )

    def send(self) -> list[Action]:
        """One ``send_pending``, as the client sees its result."""
        out = self.session.send_pending()
        for action in out:
            self.actions.append(action)
            if isinstance(action, LinkFlow):
                if action.drain:
                    self.client_dc = action.delivery_count
            elif completes(action):
                self.client_dc = serial_add(self.client_dc, 1)
                self.received.append(message_of(action))
        return out

    def pump(self) -> list[Action]:
        """Send, let the writer write everything, repeat until nothing moves."""
        out: list[Action] = []
        while True:
            step = self.send()
            self.writer.caught_up(0)
            if not step:
                return out
            out.extend(step)


def completes(action: Action) -> bool:
    """A whole message, or the last part of one."""
    if isinstance(action, TransferPart):
        return action.end == len(action.message.payload)
    return not isinstance(action, LinkFlow)


def message_of(action: Transfer | TransferPart) -> Message:
    return action.message if isinstance(action, TransferPart) else action[1]


def transfers(out: list[Action]) -> list[Message]:
    """The messages whose delivery ``out`` completes."""
    return [message_of(a) for a in out if not isinstance(a, LinkFlow) and completes(a)]


def parts(out: list[Action]) -> list[tuple[int, int, int]]:
    """(seq, start, end) of each partial transfer."""
    return [(a.message.seq, a.start, a.end) for a in out if isinstance(a, TransferPart)]


def link_flows(out: list[Action]) -> list[LinkFlow]:
    return [a for a in out if isinstance(a, LinkFlow)]


def stash_of(link: OutgoingLink) -> CreditReq | None:
    """Read the stash afresh (mypy would otherwise keep an earlier narrowing of the slot)."""
    return link.stashed_credit_req


def seqs(out: list[Action]) -> list[int]:
    return [m.seq for m in transfers(out)]


# -- §3.1 and §8.1: one capped credit request, then one batch at a time -------------------


def test_first_flow_requests_exactly_one_batch() -> None:
    h = Harness(5000, window=0)
    h.flow(5000)
    assert len(h.queue.calls) == 1
    call = h.queue.calls[0]
    assert (call.credit, call.drain, call.delivery_count) == (DEFAULT_MAX_QUEUE_CREDIT, False, 0)
    assert h.queue.statistics().ready == 5000 - 256
    stats = h.session.statistics()
    assert stats.pending_deliveries == 256
    assert stats.outgoing_pending == 257  # the deliveries, then the reply
    assert stats.credit_requests_in_flight == 1
    assert h.link.queue_flow_ctl.credit == 256
    assert h.link.client_flow_ctl.credit == 5000


def test_window_closed_sends_nothing_and_asks_for_nothing_more() -> None:
    h = Harness(5000, window=0)
    h.flow(5000)
    for _ in range(3):
        assert h.send() == []
    assert len(h.queue.calls) == 1
    assert h.queue.statistics().ready == 4744


def test_next_batch_only_once_the_previous_one_has_left() -> None:
    h = Harness(5000, window=100)
    h.flow(5000)
    out = h.send()
    assert len(transfers(out)) == 100
    # The reply waits behind the 156 deliveries still buffered: no new request.
    assert len(h.queue.calls) == 1
    assert h.link.credit_req_in_flight
    assert h.queue.statistics().ready == 4744
    h.session.remote_incoming_window = 156
    out = h.send()
    assert len(transfers(out)) == 156
    # The reply reached the head: the next batch was requested from the queue's count.
    assert len(h.queue.calls) == 2
    second = h.queue.calls[1]
    assert (second.delivery_count, second.credit, second.drain) == (256, 256, False)
    assert h.queue.statistics().ready == 5000 - 512
    assert h.session.statistics().pending_deliveries == 256


def test_credit_reply_is_handled_only_after_the_deliveries_before_it() -> None:
    h = Harness(10, window=0)
    h.flow(20, echo=True)
    pending = list(h.session.outgoing_pending)
    assert [type(item) for _, item in pending] == [Message] * 10 + [CreditReply]
    h.session.remote_incoming_window = 9
    out = h.send()
    assert len(out) == 9  # no echo FLOW yet: the reply is still behind the tenth delivery
    assert h.link.credit_req_in_flight
    h.session.remote_incoming_window = 1
    out = h.send()
    assert len(transfers(out)) == 1
    assert link_flows(out) == [LinkFlow(h.link, 10, 10, 0, False)]
    assert isinstance(out[-1], LinkFlow)
    assert not h.link.credit_req_in_flight


def test_all_5000_arrive_once_the_window_opens() -> None:
    """incoming_window_closed_rabbitmq_internal_flow: closed window, credit 5000 at once; then
    the window opens."""
    h = Harness(5000, window=0)
    h.flow(5000)
    h.send()
    assert h.queue.statistics().ready == 4744
    h.session.remote_incoming_window = 5000
    out = h.pump()
    assert seqs(out) == list(range(5000))
    assert h.queue.statistics().ready == 0
    # 5000 / 256 batches, plus the last reply: never more than one in flight.
    assert [c.credit for c in h.queue.calls] == [256] * 19 + [136]
    assert h.link.client_flow_ctl.credit == 0
    assert not h.link.credit_req_in_flight


def test_window_renewed_in_small_steps() -> None:
    """HEAD's variant of §8.1: window 100, renewed when it drops below 50."""
    h = Harness(1000, window=0)
    h.flow(1000)
    received = 0
    for _ in range(100):
        if h.session.remote_incoming_window < 50:
            h.session.remote_incoming_window = 100
        out = h.send()
        h.writer.caught_up(0)
        received += len(transfers(out))
        assert h.session.statistics().pending_deliveries <= DEFAULT_MAX_QUEUE_CREDIT
        if received == 1000:
            break
    assert received == 1000
    assert [m.seq for m in h.received] == list(range(1000))


# -- §3.1: stashed FLOWs, newest wins ---------------------------------------------------------


def test_flows_during_an_in_flight_request_are_stashed_newest_wins() -> None:
    h = Harness(1000, window=0)
    h.flow(5000)
    h.flow(10)
    assert stash_of(h.link) is not None
    h.flow(300, echo=True)
    assert len(h.queue.calls) == 1  # stashing makes no queue call
    assert h.session.statistics().stashed_credit_reqs == 1
    stash = stash_of(h.link)
    assert stash is not None
    assert (stash.delivery_count, stash.credit, stash.drain, stash.echo) == (0, 300, False, True)
    h.session.remote_incoming_window = 10_000
    out = h.pump()
    # The newest FLOW (credit 300 from count 0) applies: 256 already sent, 44 more.
    assert len(transfers(out)) == 300
    assert [c.credit for c in h.queue.calls] == [256, 44]
    assert stash_of(h.link) is None
    assert link_flows(out) == [LinkFlow(h.link, 300, 0, 700, False)]
    assert h.queue.statistics().ready == 700


def test_stashed_flow_lowering_credit_stops_after_the_buffered_batch() -> None:
    """A client lowering its credit to 0 still receives what was buffered (forced through)."""
    h = Harness(1000, window=0)
    h.flow(1000)
    h.flow(0)  # stashed: "stop"
    h.session.remote_incoming_window = 10_000
    out = h.pump()
    assert len(transfers(out)) == 256
    assert h.link.client_flow_ctl.credit == 0
    # The stash was applied at the reply: a zero-credit request, then nothing more.
    assert [c.credit for c in h.queue.calls] == [256, 0]
    assert not h.link.credit_req_in_flight
    assert h.queue.statistics().ready == 744


# -- §3.3: the window and the writer -----------------------------------------------------------


def test_window_zero_still_sends_flows() -> None:
    h = Harness(0, window=0)
    h.flow(10, drain=True)
    out = h.send()
    assert out == [LinkFlow(h.link, 10, 0, 0, True)]
    h.flow(5, echo=True)
    assert h.send() == [LinkFlow(h.link, 10, 5, 0, False)]


def test_window_counts_frames_of_multi_frame_messages() -> None:
    h = Harness(3, window=0, max_frame_size=512, payload_size=1000)
    frame_payload = 512 - 64
    frames = -(-(h.queue.statistics().ready_bytes // 3) // frame_payload)
    assert frames == 3
    h.flow(3)
    h.session.remote_incoming_window = 4
    out = h.send()
    # The first message fits; of the second only the one frame the window has left goes out.
    size = len(transfers(out)[0].payload)
    assert seqs(out) == [0]
    assert parts(out) == [(1, 0, frame_payload)]
    assert h.session.remote_incoming_window == 0
    assert h.writer.statistics().frames_pending == 4
    assert h.send() == []
    # Two more frames of window: the rest of the second message (2 frames), nothing of the third.
    h.session.remote_incoming_window = 2
    out = h.send()
    assert parts(out) == [(1, frame_payload, size)]
    assert seqs(out) == [1]
    assert h.session.remote_incoming_window == 0
    assert h.session.head_sent == 0
    h.session.remote_incoming_window = 100
    assert seqs(h.send()) == [2]


def test_flows_of_other_links_pass_deliveries_waiting_for_the_window() -> None:
    h = Harness(3, window=0)
    h.flow(3)
    empty = RecordingQueue("empty")
    other = h.session.attach_link(1, empty, ack_required=False)
    busy = h.session.attach_link(2, RecordingQueue("busy"), ack_required=False)
    busy.queue.enqueue(Message(_payload(0)))
    h.session.client_flow(other, 0, 7, True, False)
    h.session.client_flow(busy, 0, 2, True, False)
    # The empty queue's drain is answered at once; the busy link's waits behind its delivery.
    assert h.session.send_pending() == [LinkFlow(other, 7, 0, 0, True)]
    assert h.session.statistics().pending_deliveries == 4
    assert busy.credit_req_in_flight
    assert not other.credit_req_in_flight
    h.session.remote_incoming_window = 10
    out = h.session.send_pending()
    assert seqs(out) == [0, 1, 2, 0]
    assert link_flows(out) == [LinkFlow(busy, 2, 0, 0, True)]
    assert out[-1] == link_flows(out)[0]


def test_deliveries_waiting_for_the_window_are_walked_again_only_once_a_reply_joins() -> None:
    """Walked at every read while the client's window stayed shut, 31,000 waiting entries cost
    each empty frame of the client's 3-5 ms of the reactor: the waiting entries are walked for
    replies to hand out only once one has joined since the last walk."""
    h = Harness(500, window=0)
    h.flow(500)
    assert h.session.send_pending() == []
    walked = h.session.outgoing_pending
    assert len(walked) == 257  # a batch of 256 and its reply
    for _ in range(3):
        assert h.session.send_pending() == []
        assert h.session.outgoing_pending is walked
    # A drain of another link, whose queue is empty, is answered at once all the same.
    other = h.session.attach_link(1, RecordingQueue("empty"), ack_required=False)
    h.session.client_flow(other, 0, 7, True, False)
    assert h.session.send_pending() == [LinkFlow(other, 7, 0, 0, True)]
    assert h.session.outgoing_pending is not walked
    walked = h.session.outgoing_pending
    assert h.session.send_pending() == []
    assert h.session.outgoing_pending is walked


def test_detach_in_the_middle_of_a_message_forgets_its_parts() -> None:
    h = Harness(2, window=2, max_frame_size=512, payload_size=1000, ack_required=True)
    h.flow(2)
    out = h.send()
    assert parts(out) == [(0, 0, 2 * (512 - 64))]
    h.session.detach_link(h.link)
    assert h.session.head_sent == 0
    assert h.queue.statistics().ready == 2
    link = h.session.attach_link(1, h.queue, ack_required=True)
    h.session.remote_incoming_window = 100
    h.session.client_flow(link, 0, 2, False, False)
    out = h.session.send_pending()
    assert parts(out) == []
    assert [(m.seq, m.delivery_count) for m in transfers(out)] == [(0, 0), (1, 0)]


def test_writer_credit_exhausted_blocks_until_written() -> None:
    writer = Writer(initial_credit=10, more_credit_after=5)
    h = Harness(30, writer=writer)
    h.flow(30)
    out = h.send()
    assert len(transfers(out)) == 10
    assert h.session.statistics().writer_blocked
    assert h.send() == []
    # Half of what was handed is written: a bump of 5 frames.
    size = len(transfers(out)[0].payload)
    assert writer.written(5 * size) == [h.session.writer_credit]
    assert len(transfers(h.send())) == 5
    assert h.send() == []
    writer.caught_up(0)
    assert len(transfers(h.send())) == 10
    writer.caught_up(0)
    assert len(transfers(h.send())) == 5
    assert len(h.received) == 30


def test_writer_blocked_still_lets_flows_and_replies_through() -> None:
    writer = Writer(initial_credit=2, more_credit_after=1)
    h = Harness(2, writer=writer)
    h.flow(2)
    h.send()
    assert h.session.writer_credit.blocked
    h.flow(5, drain=True)
    out = h.send()
    assert out == [LinkFlow(h.link, 7, 0, 0, True)]


def test_writer_credit_splits_a_multi_frame_message() -> None:
    writer = Writer(initial_credit=2, more_credit_after=1)
    h = Harness(2, writer=writer, max_frame_size=512, payload_size=2000)
    h.flow(2)
    out = h.send()
    # 5 frames on 2 credits: 2 frames go, then the session waits for the writer.
    assert parts(out) == [(0, 0, 2 * (512 - 64))]
    assert transfers(out) == []
    assert h.session.writer_credit.credit == 0
    assert h.send() == []
    h.writer.caught_up(0)
    out = h.send()
    assert parts(out) == [(0, 2 * (512 - 64), 4 * (512 - 64))]
    h.writer.caught_up(0)
    out = h.send()
    assert seqs(out) == [0]
    size = len(transfers(out)[0].payload)
    assert parts(out) == [(0, 4 * (512 - 64), size), (1, 0, 512 - 64)]
    assert h.session.writer_credit.credit == 0


# -- drain (§3.5) --------------------------------------------------------------------------


def test_drain_with_fewer_messages_than_credit() -> None:
    h = Harness(3)
    h.flow(10, drain=True)
    out = h.send()
    assert seqs(out) == [0, 1, 2]
    assert out[-1] == LinkFlow(h.link, 10, 0, 0, True)
    assert len(link_flows(out)) == 1
    assert h.link.client_flow_ctl.credit == 0
    assert not h.link.queue_flow_ctl.drain
    # Drained: later messages wait for new credit.
    h.enqueue(1)
    assert h.send() == []
    assert h.queue.statistics().ready == 1


def test_drain_over_several_rounds() -> None:
    """The queue spends each batch fully, so the session drains another round (§3.5)."""
    h = Harness(300)
    h.flow(1000, drain=True)
    out = h.pump()
    assert seqs(out) == list(range(300))
    assert out[-1] == LinkFlow(h.link, 1000, 0, 0, True)
    assert [(c.credit, c.drain) for c in h.queue.calls] == [(256, True), (256, True)]


def test_drain_with_exactly_enough_messages() -> None:
    h = Harness(256)
    h.flow(256, drain=True)
    out = h.pump()
    assert len(transfers(out)) == 256
    assert out[-1] == LinkFlow(h.link, 256, 0, 0, True)
    assert len(h.queue.calls) == 1


def test_drain_huge_credit_near_the_wrap() -> None:
    h = Harness(0)
    for _ in range(2):
        h.flow(2_000_000_000, drain=True)
        out = h.send()
        assert out == [LinkFlow(h.link, h.client_dc, 0, 0, True)]
    assert h.client_dc == 4_000_000_000
    assert h.link.client_flow_ctl.delivery_count == 4_000_000_000
    h.enqueue(1)
    h.flow(2_000_000_000, drain=True)
    out = h.send()
    assert seqs(out) == [0]
    expected_dc = (4_000_000_000 + 2_000_000_000) & SERIAL_MASK
    assert out[-1] == LinkFlow(h.link, expected_dc, 0, 0, True)
    assert h.client_dc == expected_dc < 4_000_000_000  # wrapped
    # Credit from the wrapped count works as usual.
    h.enqueue(2)
    h.flow(1)
    assert seqs(h.send()) == [1]
    assert h.client_dc == serial_add(expected_dc, 1)


def test_drain_many() -> None:
    """amqp_client_SUITE's drain_many_classic, steps 1 to 6."""
    h = Harness(5000)
    h.flow(4999, drain=True)
    out = h.pump()
    assert len(transfers(out)) == 4999
    assert out[-1] == LinkFlow(h.link, 4999, 0, 1, True)
    h.flow(5000, drain=True)
    out = h.pump()
    assert len(transfers(out)) == 1
    assert out[-1] == LinkFlow(h.link, 9999, 0, 0, True)
    # Step 3: the credit was consumed by the drain, so new messages wait.
    h.enqueue(5000)
    assert h.pump() == []
    # Step 4: the FLOW sequence arrives before the session acts on any of it.
    for credit, drain in [(0, False), (1, False), (2500, False), (5000, False), (5000, True)]:
        h.flow(credit, drain=drain)
    out = h.pump()
    assert len(transfers(out)) == 5000
    assert out[-1] == LinkFlow(h.link, 9999 + 5000, 0, 0, True)
    assert [m.seq for m in h.received] == list(range(10_000))
    # Step 5: one more message, no credit: nothing.
    h.enqueue(1)
    assert h.pump() == []
    # Step 6: huge drain: the one message, then the drained FLOW.
    h.flow(2_000_000_000, drain=True)
    out = h.pump()
    assert len(transfers(out)) == 1
    assert out[-1] == LinkFlow(h.link, serial_add(14_999, 2_000_000_000), 0, 0, True)


def test_drain_many_flows_interleaved_with_sending() -> None:
    h = Harness(5000)
    sent = 0
    for credit, drain in [(0, False), (1, False), (2500, False), (5000, False), (5000, True)]:
        h.flow(credit, drain=drain)
        sent += len(transfers(h.send()))
        h.writer.caught_up(0)
    sent += len(transfers(h.pump()))
    assert sent == 5000
    assert isinstance(h.actions[-1], LinkFlow)
    assert h.actions[-1].drain
    assert h.actions[-1].link_credit == 0
    assert [m.seq for m in h.received] == list(range(5000))


def test_drain_with_window_closed_transfer_before_flow() -> None:
    """amqp_client_SUITE's incoming_window_closed_transfer_flow_order."""
    h = Harness(1, window=0)
    h.flow(2, drain=True)
    assert h.send() == []
    h.session.remote_incoming_window = 5
    out = h.send()
    assert [type(a) for a in out] == [tuple, LinkFlow]
    assert out[1] == LinkFlow(h.link, 2, 0, 0, True)


def test_stop_link_with_window_closed() -> None:
    """amqp_client_SUITE's incoming_window_closed_stop_link: m1 may arrive, m2 must not."""
    h = Harness(2, window=0)
    h.flow(1, drain=True)
    h.flow(0, echo=True)  # stop: credit 0 with echo, stashed behind the drain
    assert h.send() == []
    h.session.remote_incoming_window = 5
    out = h.pump()
    assert seqs(out) == [0]
    # The stop supersedes the drain, which is not answered: proton would drain the stop's
    # credit with it (see test_a_later_flow_supersedes_a_drain_that_used_up_its_credit).
    assert link_flows(out) == [LinkFlow(h.link, 1, 0, 1, False)]
    assert h.queue.statistics().ready == 1


def test_a_later_flow_supersedes_a_drain_that_used_up_its_credit() -> None:
    """A drain FLOW, then (while its request is in flight) a drain FLOW with more credit: the
    first drain's credit goes on messages, and the drain is answered once, for the later FLOW,
    when the queue has no more. Answering the first at once (RabbitMQ's order) made proton
    drain the later FLOW's credit with it, while the queue still held messages: a receiver
    then took a queue with 1,000 messages for empty (the connector's Trigger.AvailableNow)."""
    h = Harness(4000, window=0)
    h.flow(3000, drain=True)
    assert h.send() == []
    h.flow(5000, drain=True)  # the receiver's limit: 5,000
    h.session.remote_incoming_window = 10_000
    out = h.pump()
    assert len(transfers(out)) == 4000
    assert link_flows(out) == [LinkFlow(h.link, 5000, 0, 0, True)]


def test_a_later_flow_without_drain_keeps_its_credit() -> None:
    """A drain superseded by a FLOW that turns drain off: nothing is drained, and the later
    FLOW's credit serves messages that arrive afterwards."""
    h = Harness(2, window=0)
    h.flow(2, drain=True)
    h.flow(10)
    h.session.remote_incoming_window = 10_000
    out = h.pump()
    assert seqs(out) == [0, 1]
    assert link_flows(out) == []
    assert h.link.client_flow_ctl.credit == 8
    h.enqueue(3)
    assert seqs(h.pump()) == [2, 3, 4]


def test_close_link_with_window_closed() -> None:
    """amqp_client_SUITE's incoming_window_closed_close_link: nothing for the link once detached."""
    h = Harness(1, window=0)
    h.flow(2, drain=True)
    assert h.send() == []
    assert h.session.detach_link(h.link) == []
    h.session.remote_incoming_window = 5
    assert h.pump() == []
    assert h.session.statistics().outgoing_pending == 0
    assert h.queue.statistics().ready == 1


# -- §3.4: the mid-stream top-up -----------------------------------------------------------


def test_receive_many_made_available_over_time() -> None:
    """amqp_client_SUITE's receive_many_made_available_over_time_classic."""
    h = Harness(10)
    h.flow(5000)
    assert len(transfers(h.pump())) == 10
    assert not h.link.credit_req_in_flight  # the queue kept 246 credit
    for batch in (2990, 1999):
        h.enqueue(batch)
        assert len(transfers(h.pump())) == batch
        assert h.session.statistics().credit_requests_in_flight <= 1
    h.enqueue(2)
    out = h.pump()
    assert len(transfers(out)) == 1  # exactly the one credit left
    assert h.queue.statistics().ready == 1
    assert h.link.client_flow_ctl.credit == 0
    assert all(c.credit <= DEFAULT_MAX_QUEUE_CREDIT for c in h.queue.calls)


def test_mid_stream_top_up_requests_the_next_batch_when_the_queue_batch_is_spent() -> None:
    h = Harness(10)
    h.flow(600)
    h.pump()
    calls = len(h.queue.calls)
    # 246 more arrive via enqueue → route; the 247th waits in the queue.
    h.enqueue(300)
    assert h.session.statistics().pending_deliveries == 246
    assert h.queue.statistics().ready == 54
    out = h.send()
    # Sending the 246th used up the queue's batch: a top-up of min(344, 256) follows.
    assert h.queue.calls[calls].credit == 256
    assert h.queue.calls[calls].delivery_count == 256
    assert len(transfers(out)) == 300


def test_route_skips_detached_links() -> None:
    h = Harness(0)
    h.flow(5)
    h.pump()
    dispatches = h.queue.enqueue(Message(b"x"))
    assert len(dispatches) == 1
    h.session.detach_link(h.link)
    assert route(dispatches) == set()
    assert h.session.statistics().outgoing_pending == 0


def test_route_returns_the_sessions_to_pump() -> None:
    h = Harness(0)
    h.flow(5)
    h.pump()
    assert route(h.queue.enqueue(Message(b"x"))) == {h.session}


# -- detach and settle ---------------------------------------------------------------------


def test_detach_gives_buffered_deliveries_back_without_a_failed_delivery() -> None:
    h = Harness(10, window=0, ack_required=True)
    h.flow(10)
    h.session.remote_incoming_window = 3
    assert seqs(h.send()) == [0, 1, 2]
    assert h.session.detach_link(h.link) == []
    assert h.session.statistics().outgoing_pending == 0
    stats = h.queue.statistics()
    assert (stats.ready, stats.unacked, stats.consumers) == (10, 0, 0)
    assert h.session.send_pending() == []
    # A new consumer sees the three sent ones as failed once, the seven buffered ones as new.
    link = h.session.attach_link(1, h.queue, ack_required=True)
    h.session.remote_incoming_window = 100
    h.session.client_flow(link, 0, 10, False, False)
    out = h.session.send_pending()
    again = transfers(out)
    assert [m.seq for m in again] == list(range(10))
    assert [m.delivery_count for m in again] == [1] * 3 + [0] * 7
    assert [read_header(m.read()).delivery_count for m in again] == [1] * 3 + [0] * 7


def test_detach_of_a_settled_link_gives_buffered_deliveries_back() -> None:
    h = Harness(10, window=0, ack_required=False)
    h.flow(10)
    h.session.remote_incoming_window = 4
    h.send()
    h.session.detach_link(h.link)
    assert h.queue.statistics().ready == 6
    assert h.session.detach_link(h.link) == []  # a second detach is a no-op


def test_detach_hands_messages_to_another_consumer_with_credit() -> None:
    queue = RecordingQueue()
    session = Session(Writer(), remote_incoming_window=0)
    a = session.attach_link(0, queue, ack_required=True)
    b = session.attach_link(1, queue, ack_required=True)
    for i in range(4):
        queue.enqueue(Message(_payload(i)))
    session.client_flow(a, 0, 4, False, False)
    session.client_flow(b, 0, 10, False, False)
    dispatches = session.detach_link(a)
    assert [(key, m.seq) for key, m in dispatches] == [(b, 0), (b, 1), (b, 2), (b, 3)]
    assert route(dispatches) == {session}
    session.remote_incoming_window = 10
    out = session.send_pending()
    assert [(link, m.seq, m.delivery_count) for link, m in _transfer_pairs(out)] == [
        (b, 0, 0),
        (b, 1, 0),
        (b, 2, 0),
        (b, 3, 0),
    ]


def _transfer_pairs(out: list[Action]) -> list[tuple[OutgoingLink, Message]]:
    return [a for a in out if not isinstance(a, LinkFlow | TransferPart)]


def test_settle_outcomes_through_the_session() -> None:
    h = Harness(3, ack_required=True)
    h.flow(3)
    out = h.send()
    assert h.queue.statistics().unacked == 3
    assert h.session.settle(h.link, [0], Outcome.ACCEPTED, False) == []
    assert h.session.settle(h.link, [1], Outcome.MODIFIED, True) == []
    assert h.session.settle(h.link, [2], Outcome.RELEASED, False) == []
    stats = h.queue.statistics()
    assert (stats.ready, stats.unacked, stats.acknowledged) == (2, 0, 1)
    assert transfers(out)[1].delivery_count == 1
    # More credit: the requeued ones come back in order.
    h.flow(2)
    assert seqs(h.send()) == [1, 2]


def test_end_detaches_every_link() -> None:
    h = Harness(5, window=0, ack_required=True)
    other = h.session.attach_link(7, h.queue, ack_required=True)
    h.flow(2)
    h.session.client_flow(other, 0, 2, False, False)
    assert h.session.end() == []
    assert h.session.links == {}
    assert h.queue.statistics().ready == 5
    assert h.writer.statistics().sessions_blocked == 0


# -- echo ----------------------------------------------------------------------------------


def test_echo_sends_a_flow_after_the_reply() -> None:
    h = Harness(3)
    h.flow(5, echo=True)
    out = h.send()
    assert seqs(out) == [0, 1, 2]
    assert out[-1] == LinkFlow(h.link, 3, 2, 0, False)


def test_echo_with_more_credit_than_one_batch_comes_after_the_last_reply() -> None:
    h = Harness(300)
    h.flow(400, echo=True)
    out = h.pump()
    assert len(transfers(out)) == 300
    assert link_flows(out) == [LinkFlow(h.link, 300, 100, 0, False)]
    assert out[-1] == link_flows(out)[0]


def test_no_echo_no_flow() -> None:
    h = Harness(3)
    h.flow(5)
    assert link_flows(h.send()) == []


# -- statistics and construction -----------------------------------------------------------


def test_statistics_of_a_link() -> None:
    h = Harness(3)
    h.flow(5)
    stats = h.link.statistics()
    assert (stats.handle, stats.client_credit, stats.queue_credit, stats.sent) == (0, 5, 5, 0)
    assert stats.credit_req_in_flight
    h.send()
    stats = h.link.statistics()
    assert (stats.client_delivery_count, stats.client_credit, stats.sent) == (3, 2, 3)
    assert not stats.credit_req_in_flight


def test_invalid_max_queue_credit() -> None:
    with pytest.raises(ValueError, match="max_queue_credit"):
        Session(Writer(), max_queue_credit=0)


def test_small_max_queue_credit_batches() -> None:
    queue = RecordingQueue()
    session = Session(Writer(), max_queue_credit=3, remote_incoming_window=100)
    link = session.attach_link(0, queue, ack_required=False)
    for i in range(10):
        queue.enqueue(Message(_payload(i)))
    session.client_flow(link, 0, 8, False, False)
    out = session.send_pending()
    assert len(transfers(out)) == 8
    assert [c.credit for c in queue.calls] == [3, 3, 2]


# -- what the transport shows of client FLOWs ----------------------------------------------


def test_a_flow_event_after_a_transfer_is_not_a_client_flow() -> None:
    """Proton raises its flow event after every transfer it writes: same limit, no FLOW."""
    h = Harness(messages=3)
    assert h.session.transport_flow(h.link, 10, False, 0)
    h.pump()
    assert len(h.received) == 3
    for _ in range(3):
        h.link.transport_sent()
    requests = len(h.queue.calls)
    assert not h.session.transport_flow(h.link, 7, False, 0), "10 credit less 3 sent"
    assert len(h.queue.calls) == requests
    assert h.session.transport_flow(h.link, 20, False, 0), "the client raised its limit"
    assert h.link.client_flow_ctl.credit == 20
    assert h.session.transport_flow(h.link, 20, True, 0), "the same limit, now with drain"


def test_a_drain_the_transport_ended_moves_its_delivery_count() -> None:
    link = Harness().link
    link.transport_sent()
    link.transport_drained(4)
    assert link.transport_count == 5
    assert link.flow_seen(0, False, 0) is not None, "limit 5 + 0 is new"
    assert link.flow_seen(0, False, 0) is None


def test_credit_the_transport_reads_negative_is_a_big_grant_or_a_lowered_limit() -> None:
    assert granted_credit(5, 0) == 5
    assert granted_credit(-3, 3) == 0, "lowered below 3 deliveries it had not counted yet"
    assert granted_credit(-(2**31), 3) == 2**31, "a grant of 2**31 is a uint"
    link = Harness().link
    assert link.flow_seen(-(2**31), False, 0) == 2**31


def test_a_detach_gives_back_its_own_deliveries_and_leaves_the_others_untouched() -> None:
    """A DETACH costs its own link's deliveries, not the session's: the other links' entries
    in outgoing_pending stay as they are (a walk over all of them per DETACH took 0.37 s to
    detach 128 links of 256 waiting deliveries each, 0.08 s without); its own deliveries go
    back to the queue in order and are never sent."""
    h = Harness(10, window=0)
    other_queue = RecordingQueue("other")
    other = h.session.attach_link(1, other_queue, ack_required=False)
    for i in range(10):
        route(other_queue.enqueue(Message(_payload(100 + i))))
    h.flow(10)
    h.session.client_flow(other, 0, 10, False, False)
    pending = h.session.outgoing_pending
    before = list(pending)
    assert h.session.statistics().pending_deliveries == 20
    route(h.session.detach_link(h.link))
    assert h.session.outgoing_pending is pending
    assert list(pending) == before
    assert h.queue.statistics().ready == 10
    stats = h.session.statistics()
    assert (stats.pending_deliveries, stats.outgoing_pending) == (10, 11)
    h.session.remote_incoming_window = 100
    others = [item for link, item in before if link is other and isinstance(item, Message)]
    assert len(others) == 10
    assert transfers(h.send()) == others
    assert not h.session.outgoing_pending


def test_a_withdrawn_drain_answer_gives_its_credit_back() -> None:
    """The gateway withdraws a drain completion that proton could not send before a later
    client FLOW came in (gateway/links.py): the drained credit goes back onto the
    delivery-count, and all of the later FLOW's credit counts."""
    h = Harness(0)
    h.flow(5, drain=True)
    (flow,) = link_flows(h.send())
    assert (flow.delivery_count, flow.drained) == (5, 5)
    h.link.drain_withdrawn(flow.drained)
    h.enqueue(12)
    h.flow(10, dc=0)  # the later FLOW, as the client sent it: nothing drained, 10 credit
    assert len(transfers(h.pump())) == 10


def test_flow_changed_tells_a_client_flow_without_taking_it_in() -> None:
    link = Harness(0).link
    assert link.flow_seen(10, False, 0) == 10
    assert not link.flow_changed(10, False)
    link.transport_sent(3)
    assert not link.flow_changed(7, False)  # the transport spent 3 of the same limit
    assert link.flow_changed(8, False)  # the limit raised
    assert link.flow_changed(7, True)  # drain turned on
    assert link.flow_seen(8, False, 0) == 8  # still there to be acted on
