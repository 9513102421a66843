"""While the memory budget is blocked, a local queue whose deliveries no queue counts is asked
for them as another worker's queue is (session/waiting.py, docs/bounds.md): only while the
connection holds less than ``IMPORT_BATCH`` unsent (nothing at all once the budget is full), a
request sized in bytes by the largest delivery (one before it was handed any), and the credit
its queue holds when the budget blocks taken back. Before, a stream's reader or a pre-settled
consumer of stored messages that never read pulled a batch of 256, or its connection's whole
``max_outgoing_pending_size``, into a blocked budget's count, past the publishers' ceiling."""

from __future__ import annotations

from sluicegate.queues.arguments import parse_arguments
from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import ConsumerOptions, OffsetSpec
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.volatile import VolatileQueue
from sluicegate.session.outbound import LinkFlow, Session, budget_flushed, resume, route
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.waiting import (
    IMPORT_BATCH,
    UNLIMITED_IMPORT_ROOM,
    WAITING_DELIVERY_COST,
    Waiting,
)
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.writer.writer import Writer

# Large enough that a request of IMPORT_BATCH bytes is two of them.
BODY = "b" * 100_000
FIRST = ConsumerOptions(offset=OffsetSpec("first"))
CREDIT = 10_000


class Stored(Message):
    """A message handed out with its body read for its consumer (a durable queue's, to a
    pre-settled one): shared with no queue, so its session charges it in full."""

    __slots__ = ()


def _payload(n: int) -> bytes:
    return encode(Described(0x77, f"{n:04}{BODY}"))


def _session() -> Session:
    """A connection's one session, its client reading nothing yet (its window shut)."""
    writer = Writer()
    session = Session(writer, remote_incoming_window=0, waiting=Waiting())
    session.waiting.writer = writer
    return session


def _stream(count: int) -> StreamQueue:
    stream = StreamQueue("s", parse_arguments({"x-queue-type": "stream"}))
    for n in range(count):
        stream.enqueue(Message(_payload(n)))
    return stream


def _block(session: Session, *, blocked: bool = True) -> None:
    """The gateway's flush, the budget blocked and its imports' part taken (as on a worker
    alone), or let go."""
    touched = budget_flushed(session.waiting.server, blocked, blocked, UNLIMITED_IMPORT_ROOM)
    assert touched <= {session}


def _read_all(session: Session) -> list[object]:
    """The client reads: its window opens, the writer writes everything, and what waited for
    that asks on (the gateway's pump and its resume after the write)."""
    session.remote_incoming_window = 1000
    out: list[object] = list(session.send_pending())
    session.writer.caught_up(0)
    if session.waiting.resumable:
        resume(session.waiting)
    return out


def _queue_credit(queue: ClassicQueue, link: OutgoingLink) -> int:
    """White box: the credit the queue holds for a consumer."""
    return queue._consumers.by_key[link].credit


def test_only_what_the_budget_may_not_count_twice_is_asked_for_so() -> None:
    """A stream's reader and a pre-settled consumer of a classic queue may be handed bytes no
    queue counts; a consumer whose queue counts what it holds unsettled, a browser (copies
    sharing their queue's payload) and a Direct Reply-To requester (a responder's bytes on
    their way, which the budget gated as they were read) are not."""
    session = _session()
    queue = ClassicQueue("q")
    assert session.attach_link(0, _stream(0), ack_required=True).uncounted
    assert session.attach_link(1, queue, ack_required=False).uncounted
    assert not session.attach_link(2, queue, ack_required=True).uncounted
    browse = ConsumerOptions(browse=True)
    assert not session.attach_link(3, queue, ack_required=False, options=browse).uncounted
    assert not session.attach_link(4, VolatileQueue(), ack_required=False).uncounted


def test_readers_that_never_read_ask_one_request_of_bytes_while_the_budget_is_blocked() -> None:
    """Two readers on a connection whose client reads nothing, the budget blocked: the first
    asks for one delivery (it was handed none), the second waits for the connection's unsent
    bytes, and nothing more comes until the client reads. Reading, each request is a quarter
    MiB by the largest delivery; once the budget lets go, a whole batch."""
    stream = _stream(600)
    session = _session()
    waiting = session.waiting
    first = session.attach_link(0, stream, ack_required=False, options=FIRST)
    second = session.attach_link(1, stream, ack_required=False, options=FIRST)
    _block(session)
    session.client_flow(first, 0, CREDIT, False, False)
    session.client_flow(second, 0, CREDIT, False, False)
    assert len(first.waiting) == 1
    assert not second.waiting
    assert list(waiting.deferred) == [second]
    assert waiting in waiting.server.starved
    # Stamped with its offset, each is a little larger than what was published.
    size = first.waiting[0].held
    one = size + WAITING_DELIVERY_COST
    # Before: a batch of 256, 25.6 MB of bodies in the blocked budget's count, before the
    # connection's limit deferred the second's.
    assert waiting.bytes == waiting.server.total == one
    session.send_pending()
    assert waiting.bytes == one
    assert not waiting.resumable

    # The client reads: each goes on in turn, a request of IMPORT_BATCH bytes at a time once
    # its largest delivery is known.
    _read_all(session)
    assert len(second.waiting) == 1
    assert not first.waiting
    _read_all(session)
    assert len(first.waiting) == IMPORT_BATCH // size
    assert waiting.bytes <= IMPORT_BATCH + one

    # The budget lets go: a whole batch at once.
    _block(session, blocked=False)
    assert len(second.waiting) == 1 + session.max_queue_credit - 1
    assert not waiting.deferred


def test_credit_a_queue_holds_when_the_budget_blocks_is_taken_back() -> None:
    """A pre-settled consumer's queue keeps a batch of credit while it has nothing to hand
    out; the budget blocks, and then 50 stored messages come back to it (another consumer's
    connection dropped, seed 65951's kind): it is handed one, not the batch. What it was
    handed leaves the held bytes once sent, with its queue."""
    queue = ClassicQueue("q")
    session = _session()
    link = session.attach_link(0, queue, ack_required=False)
    session.client_flow(link, 0, CREDIT, False, False)
    assert _queue_credit(queue, link) == session.max_queue_credit
    _block(session)
    # The reply to the request for none comes at once, and the consumer asks again.
    session.send_pending()
    assert _queue_credit(queue, link) == 1
    assert not link.waiting
    for n in range(50):
        route(queue.enqueue(Stored(_payload(n))))
    assert len(link.waiting) == 1
    one = len(_payload(0)) + WAITING_DELIVERY_COST
    assert session.waiting.server.total == one

    # The client reads: what its queue hands it at a request is charged in full, and leaves
    # the held bytes as it is sent (taken as a holder of a shared payload, it stayed counted).
    queued = queue.held.total
    _read_all(session)
    assert len(link.waiting) == 1
    _read_all(session)
    assert len(link.waiting) == 2
    assert session.waiting.server.total == 2 * one
    _read_all(session)
    assert queue.statistics().ready == 50 - 1 - 1 - 2 - 2
    assert queue.held.total == queued - 5 * (queued // 49)


def test_a_drain_is_answered_while_the_request_waits_for_the_budget() -> None:
    """A reader whose request waits for its connection's unsent bytes drains: it is answered
    at once with nothing new, its credit spent (AMQP 1.0 §2.6.7)."""
    stream = _stream(10)
    session = _session()
    first = session.attach_link(0, stream, ack_required=False, options=FIRST)
    second = session.attach_link(1, stream, ack_required=False, options=FIRST)
    _block(session)
    session.client_flow(first, 0, CREDIT, False, False)
    session.client_flow(second, 0, CREDIT, False, False)
    assert second in session.waiting.deferred
    session.client_flow(second, 0, CREDIT, True, False)
    assert second not in session.waiting.deferred
    flows = [action for action in session.send_pending() if isinstance(action, LinkFlow)]
    assert flows == [LinkFlow(second, CREDIT, 0, 10, True)]
    assert not second.credit_req_in_flight
    assert len(first.waiting) == 1
