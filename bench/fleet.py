"""Many connections from one process: each with a sender and a receiver on its own queue.

One epoll selector over every connection's socket (``sluicegate.clients.pump.Pump`` per
connection), so a thousand connections cost one process and no threads. The parent steers the
phases over a pipe: open everything (report ``opened``), on ``go`` send and receive
``messages`` on every connection (report ``done``), then close.
"""

from __future__ import annotations

import itertools
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection as Channel
from typing import Final

from proton import Delivery, Endpoint, Receiver, Sender

from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver.arrow import describe
from sluicegate.clients.quiver.payload import encode_template

__all__ = ["GO", "Finished", "FleetPlan", "Opened", "run_fleet"]

GO: Final[str] = "go"
CONNECT_TIMEOUT_S: Final[float] = 30.0
POLL_S: Final[float] = 0.01  # the loop's wait for input when no connection has work
CONNECT_BATCH: Final[int] = 20  # connects between two passes over the open connections
PHASE_TIMEOUT_S: Final[float] = 300.0  # a phase without completion this long has failed


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """How many connections, to which queues (``prefix + N``), how many messages each."""

    host: str
    port: int
    address_prefix: str
    connections: int
    messages: int
    body_size: int


@dataclass(frozen=True, slots=True)
class Opened:
    """Every connection and link is attached; ``seconds`` from the first connect."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Finished:
    """Every connection received its messages; ``seconds`` from the first send."""

    seconds: float
    received: int


@dataclass
class Member:
    """One connection of the fleet and its two links."""

    index: int
    engine: Pump
    sender: Sender
    receiver: Receiver
    sent: int = 0
    received: int = 0


class FleetError(RuntimeError):
    """A connection failed; the message is its one line."""


def _open(plan: FleetPlan, index: int) -> Member:
    engine = Pump.connect(plan.host, plan.port, f"bench fleet {index}", CONNECT_TIMEOUT_S)
    connection = engine.connection
    connection.open()
    session = connection.session()
    session.open()
    address = f"{plan.address_prefix}{index}"
    sender = session.sender(f"fleet sender {index}")
    sender.target.address = address
    sender.open()
    receiver = session.receiver(f"fleet receiver {index}")
    receiver.source.address = address
    receiver.open()
    receiver.flow(plan.messages)
    return Member(index, engine, sender, receiver)


class Fleet:
    """The connections and the loop that moves all of them."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.selector = selectors.DefaultSelector()
        self.members: list[Member] = []
        self.message = encode_template(plan.body_size, durable=False).encoded
        self.tags = itertools.count()

    def connect(self) -> None:
        """Open every connection (TCP connects one after the other, AMQP opens overlap).

        The ones already open are served every ``CONNECT_BATCH`` connects: a server that times
        out a silent handshake (RabbitMQ: 10 s) must not close them while the rest connect.
        """
        for index in range(self.plan.connections):
            member = _open(self.plan, index)
            self.members.append(member)
            self.selector.register(member.engine.sock, selectors.EVENT_READ, member)
            member.engine.flush()
            if index % CONNECT_BATCH == CONNECT_BATCH - 1:
                self.pump(0.0)

    def pump(self, timeout: float = POLL_S) -> None:
        """Write what every connection has, read what arrived, check for failures."""
        for member in self.members:
            member.engine.flush()
        for key, _ in self.selector.select(timeout):
            member = key.data
            assert isinstance(member, Member)
            member.engine.read()
        for member in self.members:
            self.check(member)

    def check(self, member: Member) -> None:
        """``FleetError`` if the server refused a link or ended the connection."""
        engine = member.engine
        for endpoint in (member.sender, member.receiver, engine.connection):
            if endpoint.state & Endpoint.REMOTE_CLOSED:
                reason = describe(endpoint.remote_condition, "closed by the server")
                raise FleetError(f"connection {member.index}: {reason}")
        if engine.closed or engine.eof:
            lost = engine.error or "end of stream"
            raise FleetError(f"connection {member.index}: connection lost: {lost}")

    def attached(self) -> bool:
        """Every link is open at both ends."""
        return all(
            m.sender.state & Endpoint.REMOTE_ACTIVE and m.receiver.state & Endpoint.REMOTE_ACTIVE
            for m in self.members
        )

    def exchange(self) -> int:
        """Send what credit allows and take what arrived, on every connection; messages taken."""
        messages, message, taken = self.plan.messages, self.message, 0
        for member in self.members:
            sender = member.sender
            while member.sent < messages and sender.credit > 0:
                sender.delivery(str(next(self.tags)))
                sender.send(message)
                sender.advance()
                member.sent += 1
            receiver = member.receiver
            delivery: Delivery | None = receiver.current
            while delivery is not None and delivery.readable and not delivery.partial:
                receiver.recv(delivery.pending)
                receiver.advance()  # before settling: settling the current delivery advances too
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
                member.received += 1
                taken += 1
                delivery = receiver.current
        return taken

    def received(self) -> int:
        """Messages received over all connections."""
        return sum(m.received for m in self.members)

    def until(self, done: Callable[[], bool], what: str) -> None:
        """Pump until ``done()``; ``FleetError`` after ``PHASE_TIMEOUT_S``."""
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not done():
            if time.monotonic() > deadline:
                raise FleetError(f"{what}: not done after {PHASE_TIMEOUT_S:g} s")
            self.pump()

    def close(self) -> None:
        """Close every connection and release the sockets."""
        for member in self.members:
            member.engine.connection.close()
            member.engine.flush()
        for member in self.members:
            member.engine.close()


def run_fleet(plan: FleetPlan, channel: Channel) -> None:
    """Process entry point: the phases described in the module docstring."""
    fleet = Fleet(plan)
    try:
        started = time.monotonic()
        fleet.connect()
        fleet.until(fleet.attached, "attaching")
        channel.send(Opened(time.monotonic() - started))
        channel.recv()
        started = time.monotonic()
        total = plan.connections * plan.messages

        def all_received() -> bool:
            fleet.exchange()
            return fleet.received() >= total

        fleet.until(all_received, "exchanging messages")
        channel.send(Finished(time.monotonic() - started, fleet.received()))
        channel.recv()
    except FleetError as error:
        channel.send(str(error))
    except OSError as error:
        index = len(fleet.members)
        channel.send(f"connection {index}: cannot connect: {error.strerror or error}")
    finally:
        fleet.close()
