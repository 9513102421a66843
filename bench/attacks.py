"""Hostile clients for the ``hostile`` scenario, and the prober that must stay served meanwhile.

Each attack of issue 16 runs in a process of its own over proton's ``Transport`` driven by hand
(``sluicegate.clients.pump.Pump``), so that it can do what a reactor client will not:
stream a delivery and never finish it, announce a 4 GiB frame size, stop reading its socket.
The parent steers the phases over a pipe: the attacker prepares (fills queues), reports
``READY``, attacks on ``GO`` and reports ``ATTACKING`` (or ``DONE`` for an attack that ends by
itself), leaves on ``LEAVE`` and reports ``LEFT`` with what the server did to it.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection as Channel
from typing import Any, Final

from proton import Delivery, Endpoint, Link, Message, Receiver, Sender, Terminus

from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver.arrow import describe

__all__ = [
    "ATTACKS",
    "DONE",
    "GO",
    "LEAVE",
    "LEFT",
    "READY",
    "AttackPlan",
    "probe",
    "run_attack",
]

ATTACKS: Final = ("reconnect", "partial", "credit", "big-frames", "unsettled")
READY: Final = "ready"
GO: Final = "go"
ATTACKING: Final = "attacking"
DONE: Final = "done"
LEAVE: Final = "leave"
LEFT: Final = "left"
CONNECT_TIMEOUT_S: Final = 30.0
POLL_S: Final = 0.01
MiB: Final = 1024 * 1024
# Bytes the attacker lets proton hold unwritten before it sends more (the client's own memory).
CLIENT_BACKLOG: Final = MiB
# A round trip longer than this is a stall, not a slow answer.
PROBE_TIMEOUT_S: Final = 10.0
PROBE_INTERVAL_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class AttackPlan:
    """Which attack, against which server, at what scale (issue 16's figures by default)."""

    attack: str
    host: str
    port: int
    prefix: str
    connections: int = 1000
    links: int = 150
    delivery_bytes: int = 7 * MiB
    frame_bytes: int = 64 * 1024
    credit_links: int = 1000
    credit_body: int = 12 * 1024
    big_messages: int = 50
    big_body: int = 4 * MiB
    browsers: int = 8
    unsettled_messages: int = 10_000
    unsettled_body: int = 4096


class AttackError(RuntimeError):
    """The attack could not even start (the server refused the preparation)."""


def _encoded(body_size: int) -> bytes:
    data: bytes = Message(body=b"x" * body_size).encode()
    return data


def _connect(plan: AttackPlan, name: str, *, max_frame_size: int | None = None) -> Pump:
    engine = Pump.connect(plan.host, plan.port, name, CONNECT_TIMEOUT_S)
    if max_frame_size is not None:
        engine.transport.max_frame_size = max_frame_size
    engine.connection.open()
    return engine


def _pump_until(engine: Pump, done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if engine.closed or engine.connection.state & Endpoint.REMOTE_CLOSED:
            reason = describe(engine.connection.remote_condition, engine.error or "closed")
            raise AttackError(f"{what}: the server ended the connection: {reason}")
        if time.monotonic() > deadline:
            raise AttackError(f"{what}: not done after {timeout:g} s")
        engine.pump(POLL_S)


def _sender(engine: Pump, address: str, name: str, session: Any = None) -> Sender:
    ssn = session if session is not None else engine.connection.session()
    ssn.open()
    sender: Sender = ssn.sender(name)
    sender.target.address = address
    sender.open()
    return sender


def _fill(plan: AttackPlan, queue: str, count: int, body_size: int) -> None:
    """Put ``count`` messages into ``queue`` and wait until the server accepted them all."""
    engine = _connect(plan, "hostile prefill")
    sender = _sender(engine, plan.prefix + queue, "prefill")
    payload = _encoded(body_size)
    unsettled: deque[Delivery] = deque()
    sent = settled = 0

    def progress() -> bool:
        nonlocal sent, settled
        while sent < count and sender.credit > 0 and engine.transport.pending() < CLIENT_BACKLOG:
            unsettled.append(sender.delivery(str(sent)))
            sender.send(payload)
            sender.advance()
            sent += 1
        while unsettled and unsettled[0].remote_state:
            unsettled.popleft().settle()
            settled += 1
        return settled >= count

    _pump_until(engine, progress, 600.0, f"filling {queue}")
    engine.connection.close()
    engine.pump(POLL_S)
    engine.close()


def _backlog(engine: Pump, links: list[Link]) -> int:
    """Bytes the client's proton holds unwritten: framed (``pending``, which proton caps at a
    frame or so) and not yet framed (its sessions' outgoing bytes)."""
    sessions = {link.session for link in links}
    return engine.transport.pending() + sum(session.outgoing_bytes for session in sessions)


def _fate(engine: Pump, links: list[Link]) -> str:
    """What the server did to the attacker's connection and links."""
    conditions = {
        describe(link.remote_condition, "")
        for link in links
        if link.state & Endpoint.REMOTE_CLOSED and link.remote_condition is not None
    }
    if engine.connection.state & Endpoint.REMOTE_CLOSED:
        conditions.add("connection: " + describe(engine.connection.remote_condition, "closed"))
    elif engine.eof or engine.error is not None:
        conditions.add("connection: dropped by the server")
    return "; ".join(sorted(c for c in conditions if c)) or "served"


def _publish_once(plan: AttackPlan, index: int, payload: bytes) -> None:
    """One connection of the reconnect loop: open, publish one message, close."""
    engine = _connect(plan, f"hostile reconnect {index}")
    sender = _sender(engine, plan.prefix + "hostile-reconnect", "p")
    _pump_until(engine, lambda: sender.credit > 0, 30.0, "attaching")
    delivery = sender.delivery("1")
    sender.send(payload)
    sender.advance()
    _pump_until(engine, lambda: bool(delivery.remote_state), 30.0, "publishing")
    delivery.settle()
    engine.connection.close()
    _pump_until(
        engine,
        lambda: bool(engine.eof or engine.connection.state & Endpoint.REMOTE_CLOSED),
        30.0,
        "closing",
    )
    engine.close()


class Attack:
    """The attacks' common steps; one subclass-free object, the attack chosen by name."""

    def __init__(self, plan: AttackPlan, channel: Channel) -> None:
        self.plan = plan
        self.channel = channel
        self.engine: Pump | None = None
        self.links: list[Link] = []
        self.count = 0

    def prepare(self) -> None:
        plan = self.plan
        if plan.attack == "big-frames":
            _fill(plan, "hostile-big", plan.big_messages, plan.big_body)
        elif plan.attack == "unsettled":
            _fill(plan, "hostile-unsettled", plan.unsettled_messages, plan.unsettled_body)

    def go(self) -> bool:
        """Start the attack; True if it finished by itself (nothing stays to leave)."""
        attack = self.plan.attack
        if attack == "reconnect":
            self._reconnect()
            return True
        {
            "partial": self._partial,
            "credit": self._credit,
            "big-frames": self._big_frames,
            "unsettled": self._unsettled,
        }[attack]()
        return False

    def keep_going(self) -> None:
        """One step of an attack that runs until told to leave."""
        engine = self.engine
        assert engine is not None
        if engine.closed or engine.eof:
            time.sleep(POLL_S)  # the server is done with this client
            return
        if self.plan.attack == "partial":
            self._stream_partials()
        elif self.plan.attack == "credit":
            self._spend_credit()
        elif self.plan.attack == "unsettled":
            self._take()
        if self.plan.attack == "big-frames":
            time.sleep(POLL_S)  # never read the socket
            return
        if not engine.closed:
            engine.pump(POLL_S)

    def leave(self) -> str:
        engine = self.engine
        if engine is None:
            return f"{self.count} connections"
        fate = _fate(engine, self.links)
        engine.close()  # drop the socket: the attacker does not wait for any answer
        return f"{self.count:,} sent or taken; {fate}"

    # -- the attacks ----------------------------------------------------------------------

    def _reconnect(self) -> None:
        """Open, publish one message, close: ``connections`` times."""
        plan = self.plan
        payload = _encoded(100)
        for index in range(plan.connections):
            _publish_once(plan, index, payload)
            self.count += 1

    def _partial(self) -> None:
        """``links`` publishers, each streaming a delivery it never finishes."""
        plan = self.plan
        engine = self.engine = _connect(plan, "hostile partial")
        session = engine.connection.session()
        for index in range(plan.links):
            self.links.append(
                _sender(engine, f"{plan.prefix}hostile-partial-{index}", f"p{index}", session)
            )
        self._attached(lambda link: link.credit > 0)
        self.streamed = [0] * plan.links
        self.chunk = b"x" * plan.frame_bytes
        for index, link in enumerate(self.links):
            assert isinstance(link, Sender)
            link.delivery(str(index))

    def _stream_partials(self) -> None:
        engine = self.engine
        assert engine is not None
        plan = self.plan
        for index, link in enumerate(self.links):
            if engine.transport.pending() >= CLIENT_BACKLOG:
                return
            if self.streamed[index] + plan.frame_bytes >= plan.delivery_bytes:
                continue
            if link.state & Endpoint.REMOTE_CLOSED:
                continue
            assert isinstance(link, Sender)
            link.stream(self.chunk)
            self.streamed[index] += plan.frame_bytes
            self.count += plan.frame_bytes

    def _credit(self) -> None:
        """``credit_links`` publishers attached first, then every credit spent at once."""
        plan = self.plan
        engine = self.engine = _connect(plan, "hostile credit")
        per_session = 250
        session = None
        for index in range(plan.credit_links):
            if index % per_session == 0:
                session = engine.connection.session()
            self.links.append(
                _sender(engine, f"{plan.prefix}hostile-credit-{index}", f"c{index}", session)
            )
        self._attached(lambda link: link.credit > 0)
        self.payload = _encoded(plan.credit_body)

    def _spend_credit(self) -> None:
        engine = self.engine
        assert engine is not None
        if _backlog(engine, self.links) >= CLIENT_BACKLOG:
            return
        budget = CLIENT_BACKLOG // len(self.payload)
        for link in self.links:
            assert isinstance(link, Sender)
            while link.credit > 0 and budget > 0:
                link.delivery(str(self.count))
                link.send(self.payload)
                link.advance()
                self.count += 1
                budget -= 1
            if budget <= 0:
                return

    def _big_frames(self) -> None:
        """Browsers of a queue of big messages on a connection that never reads its socket."""
        plan = self.plan
        engine = self.engine = _connect(plan, "hostile big frames", max_frame_size=2**32 - 1)
        for index in range(plan.browsers):
            session = engine.connection.session()
            session.open()
            receiver: Receiver = session.receiver(f"b{index}")
            receiver.source.address = plan.prefix + "hostile-big"
            receiver.source.distribution_mode = Terminus.DIST_MODE_COPY
            receiver.open()
            receiver.flow(plan.big_messages)
            self.links.append(receiver)
        self._attached(lambda link: True)

    def _unsettled(self) -> None:
        """A consumer that grants 100,000 credit and settles nothing."""
        plan = self.plan
        engine = self.engine = _connect(plan, "hostile unsettled")
        session = engine.connection.session()
        session.open()
        receiver: Receiver = session.receiver("u")
        receiver.source.address = plan.prefix + "hostile-unsettled"
        receiver.open()
        receiver.flow(100_000)
        self.links.append(receiver)
        self._attached(lambda link: True)

    def _take(self) -> None:
        receiver = self.links[0]
        assert isinstance(receiver, Receiver)
        delivery: Delivery | None = receiver.current
        while delivery is not None and delivery.readable and not delivery.partial:
            receiver.recv(delivery.pending)
            receiver.advance()  # never settled
            self.count += 1
            delivery = receiver.current

    def _attached(self, ready: Callable[[Link], bool]) -> None:
        engine = self.engine
        assert engine is not None

        def all_ready() -> bool:
            return all(
                link.state & Endpoint.REMOTE_ACTIVE and ready(link)
                for link in self.links
                if not link.state & Endpoint.REMOTE_CLOSED
            )

        _pump_until(engine, all_ready, 120.0, "attaching")


def run_attack(plan: AttackPlan, channel: Channel) -> None:
    """Process entry point: the phases of the module docstring."""
    attack = Attack(plan, channel)
    try:
        attack.prepare()
        channel.send(READY)
        channel.recv()
        if attack.go():
            channel.send(DONE)
            channel.recv()
        else:
            channel.send(ATTACKING)
            while not channel.poll():
                attack.keep_going()
            channel.recv()
        channel.send((LEFT, attack.leave()))
    except (AttackError, OSError) as error:
        channel.send(f"{plan.attack}: {error}")


def probe(host: str, port: int, address: str, counts: Any) -> None:
    """Process entry point: round trips on ``address`` until terminated or orphaned.

    ``counts`` is a shared ``RawArray('d', 3)``: round trips done, the longest in seconds, and
    round trips that did not complete within ``PROBE_TIMEOUT_S``. A bench killed before it could
    stop its prober must not leave it probing the next run's machine, so the prober ends when
    its parent is gone.
    """
    parent = os.getppid()
    engine = Pump.connect(host, port, "hostile prober", CONNECT_TIMEOUT_S)
    engine.connection.open()
    sender = _sender(engine, address, "probe out")
    receiver: Receiver = sender.session.receiver("probe in")
    receiver.source.address = address
    receiver.open()
    receiver.flow(10)
    payload = _encoded(16)
    sequence = 0
    while os.getppid() == parent:
        started = time.monotonic()
        deadline = started + PROBE_TIMEOUT_S
        while sender.credit <= 0 and time.monotonic() < deadline:
            engine.pump(POLL_S)
        sender.delivery(str(sequence))
        sender.send(payload)
        sender.advance()
        sequence += 1
        while time.monotonic() < deadline:
            delivery: Delivery | None = receiver.current
            if delivery is not None and delivery.readable and not delivery.partial:
                receiver.recv(delivery.pending)
                receiver.advance()
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
                receiver.flow(1)
                counts[0] += 1
                counts[1] = max(counts[1], time.monotonic() - started)
                break
            engine.pump(POLL_S)
        else:
            counts[2] += 1
        time.sleep(PROBE_INTERVAL_S)
