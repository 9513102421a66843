"""Outbound flow control end to end: RabbitMQ's credit scenarios (its amqp_client_SUITE).

Each test runs a real server and drives it with the frame-level ``RawClient``, which controls its
session window, link credit, drain and echo, and reads its socket only when told. Assertions are
on counts the server reports (queue depth, the session's and writer's statistics, what proton
holds, read on the reactor thread) and on the frames the client saw, never on time: a "nothing
arrives" check is a negative observation over a short window, as in RabbitMQ's suite.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from integration.conftest import RunningServer
from proton import Message
from support.clients import publish
from support.polling import wait_until
from support.raw_client import Delivery, Frame, RawClient

from sluicegate.gateway.state import ConnectionState

# A silent period long enough to see frames that were on their way, not a speed requirement.
QUIET_S = 0.2
# RabbitMQ's DEFAULT_MAX_QUEUE_CREDIT, the server's default batch toward the session.
BATCH = 256
SERIAL = 1 << 32

MakeServer = Callable[..., RunningServer]


def new_queue() -> str:
    return f"flow-{uuid.uuid4().hex[:10]}"


def fill(server: RunningServer, queue: str, bodies: list[str]) -> None:
    outcomes = publish(server.url, queue, bodies).outcomes
    assert outcomes == ["accepted"] * len(bodies)


def body(delivery: Delivery) -> str:
    message = Message()
    message.decode(delivery.payload)
    assert isinstance(message.body, str)
    return message.body


def receive(client: RawClient, count: int) -> list[str]:
    """Read ``count`` whole messages; fail if the server stops sending before that."""
    bodies: list[str] = []
    for _ in range(count):
        delivery = client.next_message()
        assert delivery is not None, f"only {len(bodies)} of {count} messages arrived"
        bodies.append(body(delivery))
    return bodies


Consumer = Callable[..., tuple[RawClient, int]]


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    """Open raw clients, each with one session and a receiving link attached to a queue.

    ``consumer(server, queue, settled=True, **connect)`` returns the client and its link's
    handle; every client's socket is closed after the test, passed or failed.
    """
    opened: list[RawClient] = []

    def open_consumer(
        server: RunningServer, queue: str, *, settled: bool = True, **connect: object
    ) -> tuple[RawClient, int]:
        client = RawClient.connect(server.host, server.port, **connect)  # type: ignore[arg-type]
        opened.append(client)
        client.begin()
        handle = client.attach(
            "consumer", "receiver", source=queue, snd_settle_mode="settled" if settled else None
        )
        client.wait_attach(handle)
        return client, handle

    yield open_consumer
    for client in opened:
        client.abort()


def link_flows(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.performative == "flow" and f["handle"] is not None]


def transfers(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.performative == "transfer"]


@dataclass(frozen=True)
class Held:
    """What the server holds for one connection, outside the queues."""

    outgoing_pending: int
    pending_deliveries: int
    writer_blocked: bool
    writer_frames: int
    writer_bytes: int
    transport_pending: int
    proton_session_bytes: int
    proton_queued: int


def held(server: RunningServer) -> Held:
    """The only connection's session, writer and proton buffers, read on the reactor thread."""

    def read() -> Held:
        (connection,) = server.server.broker.connections
        state: ConnectionState = connection
        (session,) = state.sessions.values()
        stats = session.pure.statistics()
        writer = state.writer.statistics()
        return Held(
            outgoing_pending=stats.outgoing_pending,
            pending_deliveries=stats.pending_deliveries,
            writer_blocked=stats.writer_blocked,
            writer_frames=writer.frames_pending,
            writer_bytes=writer.bytes_pending,
            transport_pending=state.transport.pending(),
            proton_session_bytes=session.session.outgoing_bytes,
            proton_queued=sum(link.sender.queued for link in session.senders.values()),
        )

    return server.call(read)


# -- §8.1 incoming window closed --------------------------------------------------------------


def test_incoming_window_closed_holds_one_batch(
    make_server: MakeServer, consumer: Consumer
) -> None:
    server = make_server()
    queue = new_queue()
    bodies = [str(i) for i in range(5000)]
    fill(server, queue, bodies)
    client, handle = consumer(server, queue)
    client.flow(incoming_window=0)
    client.flow(handle, link_credit=5000)
    # Exactly one batch leaves the queue and waits in the session; proton holds none of it.
    wait_until(lambda: server.queue(queue).ready < 5000)
    assert client.expect_nothing(QUIET_S) == []
    assert server.queue(queue).ready == 5000 - BATCH
    now = held(server)
    assert (now.pending_deliveries, now.outgoing_pending) == (BATCH, BATCH + 1)
    assert (now.proton_session_bytes, now.proton_queued, now.writer_frames) == (0, 0, 0)
    client.flow(incoming_window=5000)
    assert receive(client, 5000) == bodies
    assert server.queue(queue).ready == 0
    client.close()


def test_window_closed_lets_flows_through_and_a_session_flow_reopens_it(
    make_server: MakeServer, consumer: Consumer
) -> None:
    server = make_server()
    full, empty = new_queue(), new_queue()
    fill(server, full, [str(i) for i in range(10)])
    client, handle = consumer(server, full)
    client.flow(incoming_window=0)
    client.flow(handle, link_credit=10)
    other = client.attach("other", "receiver", source=empty, snd_settle_mode="settled")
    client.wait_attach(other)
    # The window holds back transfers, never FLOWs: a drain of an empty queue is answered.
    client.flow(other, link_credit=7, drain=True)
    flow = client.wait_for("flow", where=lambda f: f["handle"] is not None)
    assert (flow["delivery_count"], flow["link_credit"], flow["drain"]) == (7, 0, True)
    assert transfers(client.received) == []
    assert held(server).pending_deliveries == 10
    # A session-only FLOW (no handle) of 4 frames: exactly 4 transfers, then silence.
    client.flow(incoming_window=4)
    assert receive(client, 4) == ["0", "1", "2", "3"]
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert held(server).pending_deliveries == 6
    client.flow(incoming_window=100)
    assert receive(client, 6) == [str(i) for i in range(4, 10)]
    client.close()


# -- §8.2 TCP back-pressure -------------------------------------------------------------------


@pytest.mark.slow
def test_tcp_back_pressure_bounds_what_the_server_holds(
    make_server: MakeServer, consumer: Consumer
) -> None:
    server = make_server()
    queue = new_queue()
    bodies = [f"{i}:" + "x" * 1000 for i in range(5000)]
    fill(server, queue, bodies)
    client, handle = consumer(server, queue, max_frame_size=600, rcvbuf=256)
    client.flow(handle, link_credit=5000)
    # The client reads nothing more: the server fills the socket buffers, then the writer
    # blocks the session because what it handed to proton is not being written.
    wait_until(lambda: held(server).writer_blocked, timeout=30)
    config = server.server.config
    # Per session: at most the writer's credit in frames of at most max-frame-size (600).
    bound = config.writer_initial_credit * 600
    for _ in range(5):
        assert 0 < server.queue(queue).ready < 5000
        now = held(server)
        assert now.writer_frames <= config.writer_initial_credit
        # Everything proton holds for the connection (deliveries not yet framed, frames not
        # yet written) was handed over within the writer's credit.
        assert now.writer_bytes <= bound
        assert now.transport_pending <= bound
        assert now.proton_session_bytes <= bound
        assert now.proton_queued <= config.writer_initial_credit
        assert now.pending_deliveries <= BATCH
        assert now.outgoing_pending <= BATCH + 1
        time.sleep(QUIET_S / 4)  # samples over a moment, not a speed check
    received = receive(client, 5000)
    assert received == bodies  # all of them, in order, none twice
    assert server.queue(queue).ready == 0
    client.close()


@pytest.mark.slow
def test_a_client_that_reads_nothing_is_dropped_at_send_timeout_and_a_slow_reader_is_not(
    make_server: MakeServer, consumer: Consumer
) -> None:
    """RabbitMQ's send_timeout. What proton holds for a client that reads nothing stays counted
    in the memory budget, and consumers that never read held a blocked worker's publishers'
    part until every publisher there waited for as long as they stayed (docs/bounds.md). Such
    a client is dropped once its output has waited ``send_timeout`` without moving; what it
    held unsettled goes back to the queue, nothing of its output stays counted. A client that
    reads, however slowly, moves its output on and stays."""
    server = make_server(send_timeout=2.0)
    queue = new_queue()
    bodies = [f"{i}:" + "x" * 1000 for i in range(3000)]
    fill(server, queue, bodies)
    stuck, handle = consumer(server, queue, settled=False, max_frame_size=600, rcvbuf=256)
    stuck.flow(handle, link_credit=3000)
    wait_until(lambda: held(server).writer_blocked, timeout=30)
    broker = server.server.broker
    wait_until(lambda: not server.call(lambda: list(broker.connections)), timeout=30)
    wait_until(lambda: server.queue(queue).ready == 3000, timeout=30)
    assert server.call(lambda: broker.sending.outbound_bytes()) == 0
    slow, handle = consumer(server, queue, max_frame_size=600, rcvbuf=256)
    slow.flow(handle, link_credit=3000)
    received: list[str] = []
    # Twenty messages at a time with pauses of a sixth of the timeout, for twice the timeout.
    for _ in range(12):
        received += receive(slow, 20)
        time.sleep(0.33)
    assert server.call(lambda: len(broker.connections)) == 1
    received += receive(slow, 3000 - len(received))
    assert received == bodies
    assert server.queue(queue).ready == 0


# -- a message of several frames against the window -------------------------------------------


def test_multi_frame_messages_never_overshoot_the_window(
    make_server: MakeServer, consumer: Consumer
) -> None:
    server = make_server()
    queue = new_queue()
    bodies = [f"{i}:" + "y" * 1000 for i in range(6)]
    fill(server, queue, bodies)
    client, handle = consumer(server, queue, max_frame_size=600)
    client.flow(incoming_window=3)
    client.flow(handle, link_credit=6)
    # Messages of 2 frames, a window of 3: one whole message and the first frame of the next.
    for _ in range(3):
        client.wait_for("transfer")
    assert transfers(client.expect_nothing(QUIET_S)) == []
    frames = transfers(client.received)
    assert len(frames) == 3
    assert [bool(f["more"]) for f in frames] == [True, False, True]
    now = held(server)
    assert (now.proton_session_bytes, now.proton_queued) == (0, 0)
    assert now.writer_frames == 0  # all 3 frames are written; nothing more was handed over
    # One frame at a time: each message completes, in order, and never arrives torn.
    for _ in range(9):
        client.flow(incoming_window=1)
        client.wait_for("transfer")
        assert held(server).proton_session_bytes == 0
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert len(transfers(client.received)) == 12
    got: list[str] = []
    while (delivery := client.next_message(0)) is not None:
        assert delivery.frames == 2
        got.append(body(delivery))
    assert got == bodies
    client.close()


# -- §8.3 receive many made available over time -----------------------------------------------


def test_receive_many_made_available_over_time(make_server: MakeServer, consumer: Consumer) -> None:
    server = make_server()
    queue = new_queue()
    fill(server, queue, [f"a{i}" for i in range(10)])
    client, handle = consumer(server, queue)
    client.flow(handle, link_credit=5000)
    assert receive(client, 10) == [f"a{i}" for i in range(10)]
    fill(server, queue, [f"b{i}" for i in range(2990)])
    assert receive(client, 2990) == [f"b{i}" for i in range(2990)]
    fill(server, queue, [f"c{i}" for i in range(1999)])
    assert receive(client, 1999) == [f"c{i}" for i in range(1999)]
    # One credit is left: of two new messages exactly one arrives.
    fill(server, queue, ["d0", "d1"])
    assert receive(client, 1) == ["d0"]
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert server.queue(queue).ready == 1
    client.close()


@pytest.mark.slow
def test_receive_many_auto_flow(make_server: MakeServer, consumer: Consumer) -> None:
    server = make_server()
    queue = new_queue()
    bodies = [str(i) for i in range(10_000)]
    fill(server, queue, bodies)
    client, handle = consumer(server, queue)
    client.flow(handle, link_credit=1300)
    link = client.links[handle]
    got: list[str] = []
    for _ in range(10_000):
        delivery = client.next_message()
        assert delivery is not None, f"stalled after {len(got)} messages"
        got.append(body(delivery))
        if link.link_credit < 1200:
            client.flow(handle, link_credit=1300)
    assert got == bodies
    assert server.queue(queue).ready == 0
    client.close()


# -- §8.3 drain many --------------------------------------------------------------------------


def drained_flow(client: RawClient, handle: int) -> Frame:
    """Wait for the FLOW that ends a drain on our link (drain set, link-credit 0)."""
    remote = client.links[handle].remote_handle
    return client.wait_for(
        "flow",
        where=lambda f: f["handle"] == remote and bool(f["drain"]) and f["link_credit"] == 0,
    )


@pytest.mark.slow
def test_drain_many(make_server: MakeServer, consumer: Consumer) -> None:
    server = make_server()
    queue = new_queue()
    fill(server, queue, [str(i) for i in range(5000)])
    client, handle = consumer(server, queue)
    link = client.links[handle]
    # 1. Drain with 4,999 credit: exactly 4,999 arrive, then the drained FLOW although the
    #    messages used up all the credit.
    client.flow(handle, link_credit=4999, drain=True)
    assert receive(client, 4999) == [str(i) for i in range(4999)]
    assert drained_flow(client, handle)["delivery_count"] == 4999
    # 2. Drain with 5,000: the last message, then the FLOW that drains the other 4,999.
    client.flow(handle, link_credit=5000, drain=True)
    assert receive(client, 1) == ["4999"]
    assert drained_flow(client, handle)["delivery_count"] == 5000 + 4999
    assert link.link_credit == 0
    # 3. The drain used up the credit: new messages stay in the queue.
    fill(server, queue, [str(i) for i in range(5000, 10_000)])
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert server.queue(queue).ready == 5000
    # 4. FLOWs in a burst, each superseding the one before (the session stashes the newest):
    #    all 5,000 arrive, once each, then the drain of the last one completes.
    for credit, drain in ((0, False), (1, False), (2500, False), (5000, False), (5000, True)):
        client.flow(handle, link_credit=credit, drain=drain)
    assert receive(client, 5000) == [str(i) for i in range(5000, 10_000)]
    assert drained_flow(client, handle)["delivery_count"] == 5000 + 4999 + 5000
    assert server.queue(queue).ready == 0
    # 5. No credit, nothing arrives.
    fill(server, queue, ["10000"])
    assert transfers(client.expect_nothing(QUIET_S)) == []
    # 6. A drain of 2,000,000,000: the one message, then the delivery-count moves by the rest.
    before = link.delivery_count
    client.flow(handle, link_credit=2_000_000_000, drain=True)
    assert receive(client, 1) == ["10000"]
    assert drained_flow(client, handle)["delivery_count"] == (before + 2_000_000_000) % SERIAL
    # 7. Two more such drains wrap the delivery-count around 2^32; credit still counts right.
    counts = [link.delivery_count]
    for _ in range(2):
        client.flow(handle, link_credit=2_000_000_000, drain=True)
        counts.append(drained_flow(client, handle)["delivery_count"])
    assert counts[2] < counts[1]  # wrapped
    assert counts[2] == (counts[0] + 4_000_000_000) % SERIAL
    fill(server, queue, ["w0", "w1", "w2"])
    client.flow(handle, link_credit=2)
    assert receive(client, 2) == ["w0", "w1"]
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert link.delivery_count == (counts[2] + 2) % SERIAL
    assert server.queue(queue).ready == 1
    client.close()


def test_drain_on_an_empty_queue_is_answered_at_once(
    server: RunningServer, consumer: Consumer
) -> None:
    queue = new_queue()  # declared by the ATTACH, empty
    client, handle = consumer(server, queue)
    client.flow(handle, link_credit=10, drain=True)
    flow = drained_flow(client, handle)
    assert (flow["delivery_count"], flow["link_credit"]) == (10, 0)
    assert transfers(client.received) == []
    client.close()


def test_drain_that_uses_up_exactly_all_the_credit_gets_its_flow(
    server: RunningServer, consumer: Consumer
) -> None:
    queue = new_queue()
    fill(server, queue, ["0", "1", "2"])
    client, handle = consumer(server, queue)
    client.flow(handle, link_credit=3, drain=True)
    flow = drained_flow(client, handle)
    assert (flow["delivery_count"], flow["link_credit"]) == (3, 0)
    # The FLOW follows the three transfers on the wire.
    frames = [f for f in client.received if f.performative in ("transfer", "flow")]
    assert [f.performative for f in frames] == ["transfer"] * 3 + ["flow"]
    assert [body(d) for d in iter(lambda: client.next_message(0), None)] == ["0", "1", "2"]
    # The link goes on working afterwards.
    fill(server, queue, ["3"])
    client.flow(handle, link_credit=1)
    assert receive(client, 1) == ["3"]
    client.close()


def test_a_drain_superseded_by_a_larger_one_drains_nothing_the_queue_still_has(
    server: RunningServer, consumer: Consumer
) -> None:
    """A drain of 300, then, while its messages wait for the window, a drain raising the limit
    to 500: 500 messages arrive, then one drained FLOW at 500, and 100 stay queued. The server
    used to answer the first drain after its 300 messages, proton draining the later FLOW's 200
    credit with it: a receiver took a queue with 300 messages left for empty."""
    queue = new_queue()
    fill(server, queue, [str(i) for i in range(600)])
    client, handle = consumer(server, queue)
    client.flow(incoming_window=0)
    client.flow(handle, link_credit=300, drain=True)
    assert client.expect_nothing(QUIET_S) == []
    client.flow(handle, link_credit=500, drain=True)
    assert client.expect_nothing(QUIET_S) == []
    client.flow(incoming_window=10_000)
    assert drained_flow(client, handle)["delivery_count"] == 500
    frames = [f for f in client.received if f.performative in ("transfer", "flow")]
    assert [f.performative for f in frames if f["handle"] is not None] == ["transfer"] * 500 + [
        "flow"
    ]
    assert receive(client, 500) == [str(i) for i in range(500)]
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert server.queue(queue).ready == 100
    client.close()


# -- §8.3 window closed: order, stop link, close link -----------------------------------------


def test_transfer_comes_before_the_drain_flow(server: RunningServer, consumer: Consumer) -> None:
    queue = new_queue()
    fill(server, queue, ["only"])
    client, handle = consumer(server, queue)
    client.flow(incoming_window=0)
    client.flow(handle, link_credit=2, drain=True)
    assert client.expect_nothing(0.3) == []
    client.flow(incoming_window=5)
    flow = drained_flow(client, handle)
    assert flow["delivery_count"] == 2
    frames = [f for f in client.received if f.performative in ("transfer", "flow")]
    assert [f.performative for f in frames] == ["transfer", "flow"]
    assert receive(client, 1) == ["only"]
    client.close()


def test_stop_link_keeps_the_rest_in_the_queue(make_server: MakeServer, consumer: Consumer) -> None:
    server = make_server()
    queue = new_queue()
    fill(server, queue, ["m1", "m2"])
    client, handle = consumer(server, queue)
    client.flow(incoming_window=0)
    client.flow(handle, link_credit=1, drain=True)
    # m1 left the queue and waits in the session for the window when the client stops the link.
    wait_until(lambda: held(server).pending_deliveries == 1)
    client.flow(handle, link_credit=0, echo=True)
    assert client.expect_nothing(0.05) == []
    client.flow(incoming_window=5)
    client.expect_nothing(0.5)
    # m1 was already on its way and may arrive; m2 must not.
    arrived = [body(d) for d in iter(lambda: client.next_message(0), None)]
    assert arrived in ([], ["m1"])
    assert server.queue(queue).ready >= 1
    # Nothing was lost on the way: with credit again, the rest comes, in order, once.
    client.flow(handle, link_credit=2)
    assert arrived + receive(client, 2 - len(arrived)) == ["m1", "m2"]
    assert transfers(client.expect_nothing(QUIET_S)) == []
    assert server.queue(queue).ready == 0
    client.close()


def test_close_link_drops_its_buffered_deliveries(
    server: RunningServer, consumer: Consumer
) -> None:
    queue = new_queue()
    fill(server, queue, ["m"])
    client, handle = consumer(server, queue)
    remote = client.links[handle].remote_handle
    client.flow(incoming_window=0)
    client.flow(handle, link_credit=2, drain=True)
    assert client.expect_nothing(0.3) == []
    client.detach(handle)
    client.wait_for("detach")
    seen = len(client.received)
    client.flow(incoming_window=5)
    late = client.expect_nothing(0.3)
    assert [f for f in late if f["handle"] == remote] == []
    assert len(client.received) == seen + len(late)
    assert server.queue(queue).ready == 1
    client.close()


def test_detach_gives_unsettled_deliveries_back(server: RunningServer, consumer: Consumer) -> None:
    queue = new_queue()
    fill(server, queue, [str(i) for i in range(5)])
    client, handle = consumer(server, queue, settled=False)
    client.flow(handle, link_credit=5)
    assert receive(client, 5) == [str(i) for i in range(5)]
    wait_until(lambda: server.queue(queue).unacked == 5)
    client.detach(handle)
    client.wait_for("detach")
    wait_until(lambda: server.queue(queue).ready == 5)
    assert server.queue(queue).unacked == 0
    client.close()
