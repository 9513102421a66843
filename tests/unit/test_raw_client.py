"""The raw AMQP 1.0 test client against a real peer: a proton broker on a background thread.

The flow-control tests trust this client to put exactly the frames they ask for on the wire and
to read back what the server did, so it is checked here against proton, an independent AMQP 1.0
implementation, over loopback.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Iterator
from typing import Protocol, TypeVar

import pytest
from proton import (
    Condition,
    Described,
    Disposition,
    Endpoint,
    Event,
    Handler,
    Link,
    Message,
    Terminus,
    symbol,
    uint,
    ulong,
)
from proton.reactor import ApplicationEvent, Container, EventInjector
from support.frames import (
    AMQP_HEADER,
    HEARTBEAT,
    ProtocolError,
    described,
    encode_frame,
    parse_frame,
)
from support.polling import wait_until
from support.ports import free_port
from support.raw_client import AmqpError, Outcome, RawClient

_T = TypeVar("_T")

HOST = "127.0.0.1"
# Credit the broker grants each publisher, topped up at half: enough that no test waits on it.
PUBLISH_CREDIT = 1000
# proton's own default max-frame-size is 32 KiB; a larger one keeps small tests single-frame.
BROKER_MAX_FRAME = 65536
# Long enough for a loopback round trip on a loaded CI box, short enough to keep tests fast.
QUIET_S = 0.3
# Addresses starting with this are refused, to exercise the §2.6.3 refusal path.
REFUSED_PREFIX = "refuse"
# snd-settle-mode "settled" (§2.8.2), as proton reports the client's choice.
SND_SETTLED = 1


class Broker(Handler):
    """Keeps encoded messages per address and serves consumers as far as their credit allows.

    Proton itself holds transfers back while the client's session incoming-window is closed,
    which the window tests rely on. ``outcomes`` records the dispositions consumers send.
    """

    def __init__(self, max_frame_size: int, idle_timeout_s: float | None) -> None:
        self.max_frame_size = max_frame_size
        self.idle_timeout_s = idle_timeout_s
        self.queues: dict[str, collections.deque[bytes]] = collections.defaultdict(
            collections.deque
        )
        self.consumers: dict[str, list[Link]] = collections.defaultdict(list)
        self.unsettled: dict[str, bytes] = {}  # payloads sent unsettled, by delivery tag
        self.outcomes: list[tuple[bytes, int, bool, bool]] = []
        self.port = free_port()
        self.ready = threading.Event()
        self.injector = EventInjector()
        self.container = Container(self)
        self.container.selectable(self.injector)
        self._tags = 0

    def on_reactor_init(self, event: Event) -> None:
        self.acceptor = self.container.listen(f"{HOST}:{self.port}")
        self.ready.set()

    def on_connection_bound(self, event: Event) -> None:
        transport = _of(event.transport)
        transport.max_frame_size = self.max_frame_size
        if self.idle_timeout_s is not None:
            transport.idle_timeout = self.idle_timeout_s

    def on_connection_remote_open(self, event: Event) -> None:
        _of(event.connection).open()

    def on_session_remote_open(self, event: Event) -> None:
        _of(event.session).open()

    def on_link_remote_open(self, event: Event) -> None:
        link = _of(event.link)
        address = (link.remote_source if link.is_sender else link.remote_target).address or ""
        if address.startswith(REFUSED_PREFIX):
            link.condition = Condition("amqp:not-found", f"no node {address}")
            (link.source if link.is_sender else link.target).type = Terminus.UNSPECIFIED  # null
            link.open()
            link.close()
        elif link.is_sender:
            link.source.address = address
            link.open()
            self.consumers[address].append(link)
            self._dispatch(address)
        else:
            link.target.address = address
            link.open()
            link.flow(PUBLISH_CREDIT)

    def on_link_remote_close(self, event: Event) -> None:
        _of(event.link).close()

    def on_session_remote_close(self, event: Event) -> None:
        _of(event.session).close()

    def on_connection_remote_close(self, event: Event) -> None:
        _of(event.connection).close()

    def on_link_flow(self, event: Event) -> None:
        link = _of(event.link)
        if link.is_sender:
            self._dispatch(_source(link))
            self._drain(link)

    def on_transport(self, event: Event) -> None:
        # Deliveries held back by a closed session window leave later, with no link event.
        for links in self.consumers.values():
            for link in links:
                self._drain(link)

    def on_delivery(self, event: Event) -> None:
        delivery = _of(event.delivery)
        link = delivery.link
        if link.is_receiver:
            if delivery.readable and not delivery.partial:
                payload = _of(link.recv(delivery.pending))
                link.advance()
                delivery.update(Disposition.ACCEPTED)
                delivery.settle()
                address = link.target.address or ""
                self.queues[address].append(payload)
                self._dispatch(address)
                if link.credit < PUBLISH_CREDIT // 2:
                    link.flow(PUBLISH_CREDIT - link.credit)
        elif delivery.remote_state:
            remote = delivery.remote
            state = delivery.remote_state
            outcome = (delivery.tag.encode(), state, remote.failed, remote.undeliverable)
            self.outcomes.append(outcome)
            payload = self.unsettled.pop(delivery.tag)
            if state in (Disposition.RELEASED, Disposition.MODIFIED):
                self.queues[_source(link)].appendleft(payload)
            delivery.settle()
            self._dispatch(_source(link))

    def on_broker_stop(self, event: Event) -> None:
        self.acceptor.close()
        self.injector.close()
        self.container.stop()

    @staticmethod
    def _drain(link: Link) -> None:
        """Answer a drain once nothing is queued, so the FLOW follows the last TRANSFER."""
        if link.drain_mode and link.credit > 0 and not link.queued:
            link.drained()

    def _dispatch(self, address: str) -> None:
        queue = self.queues[address]
        for link in self.consumers[address]:
            live = link.state & Endpoint.LOCAL_ACTIVE and link.state & Endpoint.REMOTE_ACTIVE
            while live and link.credit > 0 and queue:
                payload = queue.popleft()
                self._tags += 1
                tag = str(self._tags)
                delivery = link.delivery(tag)
                link.stream(payload)
                link.advance()
                if link.remote_snd_settle_mode == SND_SETTLED:
                    delivery.settle()
                else:
                    self.unsettled[tag] = payload


def _of(value: _T | None) -> _T:
    """Proton types event fields as optional; each handler runs only when its field is set."""
    assert value is not None
    return value


def _source(link: Link) -> str:
    return link.source.address or ""


class StartBroker(Protocol):
    def __call__(
        self, max_frame_size: int = BROKER_MAX_FRAME, idle_timeout_s: float | None = None
    ) -> Broker: ...


@pytest.fixture
def start_broker() -> Iterator[StartBroker]:
    """Start brokers on background threads; stop them all after the test."""
    running: list[tuple[Broker, threading.Thread]] = []

    def start(
        max_frame_size: int = BROKER_MAX_FRAME, idle_timeout_s: float | None = None
    ) -> Broker:
        broker = Broker(max_frame_size, idle_timeout_s)
        thread = threading.Thread(target=broker.container.run, daemon=True)
        thread.start()
        running.append((broker, thread))
        assert broker.ready.wait(5.0)
        return broker

    yield start
    for broker, thread in running:
        broker.injector.trigger(ApplicationEvent("broker_stop"))
        thread.join(5.0)
        assert not thread.is_alive()


@pytest.fixture
def broker(start_broker: StartBroker) -> Broker:
    return start_broker()


def _body(payload: bytes) -> object:
    message = Message()
    message.decode(payload)
    return message.body


def _publish(client: RawClient, address: str, bodies: list[str]) -> None:
    """Publish ``bodies`` to ``address`` on a fresh sender link and wait for the accepts."""
    handle = client.attach(f"publisher-{address}", "sender", target=address)
    assert client.wait_attach(handle).target_address == address
    client.wait_credit(handle)
    ids = [client.send(handle, Message(body=body).encode()) for body in bodies]
    outcomes = client.wait_outcomes(ids)
    assert all(o is not None and o.name == "accepted" for o in outcomes.values())
    client.detach(handle)
    client.wait_for("detach")


def _consumer(client: RawClient, address: str, *, settled: bool = True) -> int:
    handle = client.attach(
        f"consumer-{address}",
        "receiver",
        source=address,
        snd_settle_mode="settled" if settled else "unsettled",
    )
    assert client.wait_attach(handle).source_address == address
    return handle


def test_open_begin_attach_detach_end_close(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port, max_frame_size=4096) as client:
        assert client.peer_open is not None
        assert client.peer_max_frame_size == BROKER_MAX_FRAME
        session = client.begin(incoming_window=100)
        assert session.begin_reply is not None
        assert session.remote_channel == session.begin_reply.channel
        assert session.next_incoming_id == session.begin_reply["next_outgoing_id"]
        handle = client.attach("r", "receiver", source="q1", properties={"p": "v"})
        attached = client.wait_attach(handle)
        assert attached.error is None
        assert attached.source_address == "q1"
        assert attached.frame["role"] is False  # the broker's end is the sender
        assert attached.frame["initial_delivery_count"] == 0
        client.detach(handle)
        assert client.wait_for("detach")["closed"] is True
        client.end()
        client.wait_for("end")
        close = client.close()
        assert close is not None
        assert close["error"] is None
        performatives = [f.performative for f in client.received]
    assert performatives == [
        *("sasl_mechanisms", "sasl_outcome", "open", "begin"),
        *("attach", "detach", "end", "close"),
    ]


def test_connect_without_sasl(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port, sasl=False) as client:
        client.begin()
        assert [f.performative for f in client.received] == ["open", "begin"]


def test_second_session_routes_by_channel(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin(0)
        client.begin(1, next_outgoing_id=2**32 - 2)  # ids wrap around within the test
        _publish(client, "two", ["a"])
        handle = client.attach("r1", "receiver", source="two", channel=1)
        client.wait_attach(handle)
        client.flow(handle, link_credit=1)
        delivery = client.next_message()
        assert delivery is not None
        assert delivery.handle == handle
        assert _body(delivery.payload) == "a"


def test_credit_bounds_what_arrives(broker: Broker) -> None:
    bodies = [f"m{i}" for i in range(5)]
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        _publish(client, "q", bodies)
        handle = _consumer(client, "q")
        client.flow(handle, link_credit=3)
        got = [client.next_message() for _ in range(3)]
        assert [_body(d.payload) for d in got if d is not None] == bodies[:3]
        assert all(d is not None and d.settled and d.handle == handle for d in got)
        assert not client.expect_nothing(QUIET_S), "sent beyond the credit"
        link = client.links[handle]
        assert (link.delivery_count, link.link_credit) == (3, 0)
        client.flow(handle, link_credit=10)
        rest = [client.next_message() for _ in range(2)]
        assert [_body(d.payload) for d in rest if d is not None] == bodies[3:]
        assert (link.delivery_count, link.link_credit) == (5, 8)


def test_sender_credit_follows_the_peer(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        handle = client.attach("s", "sender", target="c")
        client.wait_attach(handle)
        assert client.wait_credit(handle) == PUBLISH_CREDIT
        ids = [client.send(handle, Message(body=i).encode()) for i in range(3)]
        assert ids == [0, 1, 2]
        assert client.links[handle].link_credit == PUBLISH_CREDIT - 3
        assert client.wait_outcomes(ids)[2] is not None


def test_large_message_is_split_and_reassembled(start_broker: StartBroker) -> None:
    broker = start_broker(max_frame_size=4096)
    payload = Message(body=bytes(range(256)) * 4096).encode()  # a 1 MiB body
    with RawClient.connect(HOST, broker.port, max_frame_size=4096) as client:
        session = client.begin()
        handle = client.attach("s", "sender", target="big")
        client.wait_attach(handle)
        client.wait_credit(handle)
        delivery_id = client.send(handle, payload)
        # proton closes the connection on any frame above its max-frame-size, so an accept
        # proves every frame fitted.
        assert session.next_outgoing_id > len(payload) // 4096
        outcome = client.wait_outcomes([delivery_id])[delivery_id]
        assert outcome is not None
        assert outcome.name == "accepted"
        receiver = _consumer(client, "big")
        client.flow(receiver, link_credit=1)
        delivery = client.next_message()
        assert delivery is not None
        assert delivery.payload == payload
        transfers = [f for f in client.received if f.performative == "transfer"]
        assert len(transfers) == delivery.frames > len(payload) // 4096
        assert [bool(f["more"]) for f in transfers] == [True] * (delivery.frames - 1) + [False]
        assert client.links[receiver].delivery_count == 1  # deliveries, not frames


def test_small_receive_buffer_still_yields_every_message(broker: Broker) -> None:
    bodies = [f"{i:04d}" + "x" * 1000 for i in range(200)]
    with RawClient.connect(HOST, broker.port) as publisher:
        publisher.begin()
        _publish(publisher, "slow", bodies)
    with RawClient.connect(HOST, broker.port, rcvbuf=4096, max_frame_size=600) as client:
        client.begin()
        handle = _consumer(client, "slow")
        client.flow(handle, link_credit=len(bodies))
        got = [client.next_message() for _ in bodies]
        assert [_body(d.payload) for d in got if d is not None] == bodies
        assert all(d is not None and d.frames == 2 for d in got)


def test_frame_above_the_peer_max_frame_size_is_refused(start_broker: StartBroker) -> None:
    broker = start_broker(max_frame_size=4096)
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        handle = client.attach("s", "sender", target="x")
        client.wait_attach(handle)
        client.wait_credit(handle)
        client.peer_max_frame_size = 8192  # lie to ourselves to produce an oversized frame
        client.send(handle, b"x" * 6000)
        close = client.wait_for("close")
        assert close["error"]["condition"] == "amqp:connection:framing-error"


def test_drain_on_an_empty_queue_advances_delivery_count(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        handle = _consumer(client, "empty")
        client.flow(handle, link_credit=5, drain=True)
        flow = client.wait_for("flow", where=lambda f: f["handle"] is not None)
        assert (flow["delivery_count"], flow["link_credit"], flow["drain"]) == (5, 0, True)
        link = client.links[handle]
        assert (link.delivery_count, link.link_credit) == (5, 0)


def test_closed_incoming_window_holds_transfers_until_reopened(broker: Broker) -> None:
    bodies = [f"w{i}" for i in range(5)]
    with RawClient.connect(HOST, broker.port) as client:
        session = client.begin()
        _publish(client, "win", bodies)
        handle = _consumer(client, "win")
        client.flow(incoming_window=0)
        client.flow(handle, link_credit=5)
        assert not client.expect_nothing(QUIET_S), "transfers passed a closed window"
        client.flow(incoming_window=5000)
        got = [client.next_message() for _ in bodies]
        assert [_body(d.payload) for d in got if d is not None] == bodies
        assert session.incoming_window == 5000 - len(bodies)


def test_transfer_arrives_before_the_drain_flow(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        _publish(client, "order", ["only"])
        handle = _consumer(client, "order")
        client.flow(incoming_window=0)
        client.flow(handle, link_credit=2, drain=True)
        assert not client.expect_nothing(QUIET_S)
        start = len(client.received)
        client.flow(incoming_window=5)
        assert client.next_message() is not None
        flow = client.wait_for("flow", where=lambda f: bool(f["drain"]))
        assert (flow["delivery_count"], flow["link_credit"]) == (2, 0)
        assert [f.performative for f in client.received[start:]] == ["transfer", "flow"]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("accepted", (Disposition.ACCEPTED, False, False)),
        ("rejected", (Disposition.REJECTED, False, False)),
        ("released", (Disposition.RELEASED, False, False)),
        (("modified", True, True), (Disposition.MODIFIED, True, True)),
    ],
)
def test_disposition_reaches_the_sender(
    broker: Broker, state: Outcome, expected: tuple[int, bool, bool]
) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        _publish(client, "d", ["x"])
        handle = _consumer(client, "d", settled=False)
        client.flow(handle, link_credit=1)
        delivery = client.next_message()
        assert delivery is not None
        assert not delivery.settled
        client.disposition(delivery.delivery_id, state=state)
        wait_until(lambda: bool(broker.outcomes), timeout=5.0)
        assert broker.outcomes == [(delivery.tag, *expected)]


def test_released_message_is_delivered_again(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        _publish(client, "again", ["x"])
        handle = _consumer(client, "again", settled=False)
        client.flow(handle, link_credit=2)
        first = client.next_message()
        assert first is not None
        client.disposition(first.delivery_id, state="released")
        second = client.next_message()
        assert second is not None
        assert second.payload == first.payload
        assert second.delivery_id == first.delivery_id + 1


def test_refused_attach_reports_the_detach_error(broker: Broker) -> None:
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        handle = client.attach("r", "receiver", source=f"{REFUSED_PREFIX}-me")
        attached = client.wait_attach(handle)
        assert attached.source is None
        assert attached.error is not None
        assert attached.error["condition"] == "amqp:not-found"


def test_detach_with_an_error_and_a_filter(broker: Broker) -> None:
    selector = described("accepted")  # any described value will do as a filter
    with RawClient.connect(HOST, broker.port) as client:
        client.begin()
        handle = client.attach("r", "receiver", source="f", filters={"test-filter": selector})
        client.wait_attach(handle)
        client.detach(handle, error=AmqpError("amqp:internal-error", "test", {"k": ulong(1)}))
        assert client.wait_for("detach")["handle"] == client.links[handle].remote_handle


def test_heartbeats_keep_an_idle_connection_open(start_broker: StartBroker) -> None:
    broker = start_broker(idle_timeout_s=0.4)
    with RawClient.connect(HOST, broker.port) as client:
        assert client.peer_idle_timeout_ms is not None
        assert not client.expect_nothing(1.0)  # proton drops a silent peer after 0.4 s
        client.begin()


def test_wrong_protocol_header_is_answered_with_amqp_and_a_framing_error(broker: Broker) -> None:
    with socket.create_connection((HOST, broker.port), timeout=5.0) as sock:
        sock.sendall(b"AMQP\x09\x01\x00\x00")
        answer = bytearray()
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer[:8] == AMQP_HEADER
    del answer[:8]
    frames = [parse_frame(answer, 4096), parse_frame(answer, 4096)]
    assert [f.performative for f in frames if f is not None] == ["open", "close"]
    assert frames[1] is not None
    assert frames[1]["error"]["condition"] == "amqp:connection:framing-error"


def test_parse_frame_waits_for_whole_frames_and_skips_heartbeats() -> None:
    flow = encode_frame(3, described("flow", incoming_window=uint(7)))
    buffer = bytearray(HEARTBEAT + flow[:-1])
    assert parse_frame(buffer, 512) is None
    buffer += flow[-1:]
    frame = parse_frame(buffer, 512)
    assert frame is not None
    assert (frame.channel, frame.performative, frame["incoming_window"]) == (3, "flow", 7)
    assert frame["drain"] is None
    assert not buffer


def test_parse_frame_decodes_symbolic_descriptors() -> None:
    body = Described(symbol("amqp:end:list"), [])
    frame = parse_frame(bytearray(encode_frame(0, body)), 512)
    assert frame is not None
    assert frame.performative == "end"


@pytest.mark.parametrize(
    "data",
    [
        encode_frame(0, described("close"), b"x" * 600),  # too big for max-frame-size 512
        b"\x00\x00\x00\x04\x02\x00\x00\x00",  # size below the 8-byte header
        encode_frame(0, described("accepted")),  # not a performative
    ],
)
def test_parse_frame_rejects_bad_frames(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_frame(bytearray(data), 512)
