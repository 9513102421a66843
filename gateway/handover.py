"""Handing a plain connection to the worker that owns the queue of its first link.

docs/workers.md#handing-a-connection-over says why and what; wire/handover.py keeps the bytes
and the messages. Here the IO, on both ends:

- **Giving** (worker A). A plain connection's first ATTACH is kept from proton
  (``Recording``); the socket is no longer read. Once A's OPEN and BEGIN are written, if the
  ATTACH names a queue another worker B owns and nothing else is open on the connection, A
  sends B the socket (``SCM_RIGHTS``) with every byte it read and wrote, and writes nothing
  more. B's READY within :data:`TIMEOUT` makes A answer GO and drop the connection without a
  frame; anything else (REFUSE, no answer, B down) and A gives proton the ATTACH and serves on.
- **Taking** (worker B). B makes a connection as for an accepted socket, replays what A read up
  to the ATTACH and, instead of writing, checks that its server wrote exactly what A wrote
  (the SASL outcome, OPEN, BEGIN: the same configuration makes the same bytes). Then READY;
  on GO it gives proton the ATTACH and what followed and serves. An offer past its deadline, a
  mismatch or a refused login is refused; without GO by the deadline and :data:`GRACE` B drops
  its copy of the socket, writing nothing, and A (which let go of nothing) serves on.

Each worker binds one datagram socket in the abstract namespace, named after the supervisor's
pid and its index, and takes messages only from processes of its own user whose parent is its
own supervisor (``SCM_CREDENTIALS``).
"""

from __future__ import annotations

import array
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from proton import Endpoint, Event, Handler
from proton.reactor import Container

from sluicegate.gateway import reading
from sluicegate.gateway.broker import Broker
from sluicegate.gateway.feeding import feed
from sluicegate.gateway.management.node import ADDRESS as MANAGEMENT
from sluicegate.gateway.proton.internals import Selectable, reactor_now, register, transport_of
from sluicegate.gateway.state import ConnectionState
from sluicegate.queues.queue_homes import proposed_home
from sluicegate.session.channel.remote import RemoteQueue
from sluicegate.wire.addresses import QueueAddress, parse_address, parse_target
from sluicegate.wire.errors import AmqpError
from sluicegate.wire.handover import (
    MAX_RECORDED,
    Expected,
    HandoverError,
    Kind,
    Message,
    Recording,
    attach_address,
    decode_message,
    encode,
)

if TYPE_CHECKING:
    from sluicegate.gateway.listener import Listener

log = logging.getLogger("sluicegate.handover")

# Seconds the giving worker waits for READY before it serves the connection itself: a taker
# replays a handshake in well under a millisecond, and a PLAIN login's password check takes
# tens; a taker stopped or swamped for longer than this is not one to hand clients to.
TIMEOUT: Final = 2.0
# Seconds past the giver's deadline the taker keeps an offer it answered READY to, so that a GO
# sent just before the deadline is read before the taker gives up.
GRACE: Final = 1.0
# An offer that reaches the taker with less than this left before its deadline is refused:
# too little time to replay it and answer.
MIN_LEFT: Final = 0.1
# A datagram's room: an offer's header and bytes, at most MAX_RECORDED of them.
_DATAGRAM: Final = MAX_RECORDED + 64
_CREDENTIALS: Final = 12  # struct ucred: pid, uid, gid


def address(supervisor: int, index: int) -> str:
    """Worker ``index``'s socket in the abstract namespace."""
    return f"\0sluicegate-handover-{supervisor}-{index}"


@dataclass(slots=True)
class _Offer:
    state: ConnectionState
    deadline: float


@dataclass(slots=True)
class _Arrival:
    """A connection another worker offered, until GO or the end of the offer."""

    key: tuple[int, int]
    state: ConnectionState
    expected: Expected
    tail: bytes
    deadline: float
    ready: bool = False

    def absorb(self, state: ConnectionState, data: bytes) -> None:
        """What the server wrote in place of the socket: it must be what the giver wrote."""
        self.expected.take(data)


class _Again(Handler):
    """The one timer set again for deadlines a timer fired before (``Handovers._expire``)."""

    def __init__(self, expire: Callable[[], None]) -> None:
        super().__init__()
        self.set = False
        self._expire = expire

    def on_timer_task(self, event: Event) -> None:
        self.set = False
        self._expire()


class Handovers(Handler):
    """One worker's hand-overs, given and taken."""

    def __init__(
        self,
        index: int,
        container: Container,
        broker: Broker,
        max_pending: int,
        *,
        declares: bool = True,
    ) -> None:
        super().__init__()
        # Whether an ATTACH declares a missing queue (``attach_declares_queues``): only then is
        # a queue not declared yet handed to the worker that will own it.
        self._declares = declares
        self._index = index
        self._supervisor = os.getppid()
        self._container = container
        self._broker = broker
        self._max_pending = max_pending
        self.listener: Listener | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.setblocking(False)
        sock.bind(address(self._supervisor, index))
        self._sock = sock
        self._selectable: Selectable = register(container, sock, self)
        # Connections whose first ATTACH is kept from proton, not offered yet.
        self._candidates: dict[ConnectionState, float] = {}
        self._offers: dict[int, _Offer] = {}
        self._serial = 0
        self._arrivals: dict[tuple[int, int], _Arrival] = {}
        self._again = _Again(self._expire)
        # Counted for the metrics page and the tests.
        self.given = 0
        self.taken = 0
        self.kept = 0

    def record(self, state: ConnectionState) -> None:
        """Record a plain connection until its first ATTACH (gateway/listener.py)."""

        def held() -> None:
            self._candidates[state] = time.monotonic()

        state.recording = Recording(held)

    def close(self) -> None:
        """The server is shutting down: nothing more is given or taken."""
        for state in list(self._candidates):
            self._resume(state)
        if not self._selectable.is_terminal:
            self._selectable.terminate()
            self._selectable.update()

    # -- giving ---------------------------------------------------------------------------

    def poll(self) -> None:
        """Each pass of the reactor: offer what is ready, resume what cannot be handed over,
        and answer for the arrivals whose replay is written."""
        for state, since in list(self._candidates.items()):
            self._consider(state, since)
        for arrival in list(self._arrivals.values()):
            self._check_arrival(arrival)

    def _consider(self, state: ConnectionState, since: float) -> None:
        recording = state.recording
        if recording is None or state.closed:
            self._candidates.pop(state, None)
            return
        if recording.over:
            self._resume(state)
            return
        frame = recording.attach
        if frame is None:
            return
        selectable = state.selectable
        transport = state.transport
        if getattr(selectable, "gate", None) is not None or transport.pending() > 0:
            # Its OPEN and BEGIN are still being written; a client that does not read them
            # within the timeout keeps its worker.
            if time.monotonic() - since > TIMEOUT:
                self._resume(state)
            return
        home = self._home(state, frame)
        if home is None:
            self._resume(state)  # its own worker's queue, or nothing it can be handed for
            return
        held = recording.held
        if (
            held is None
            or len(self._offers) >= self._max_pending
            or not recording.read.endswith(held)
            or state.backlog
            or state.held.data
            or state.reads_paused
        ):
            self._keep(state)
            return
        self._serial = serial = (self._serial + 1) & 0xFFFFFFFF
        deadline = time.monotonic() + TIMEOUT
        offer = Message(
            Kind.OFFER,
            self._index,
            serial,
            deadline,
            bytes(recording.read),
            len(held),
            bytes(recording.written),
        )
        fd = selectable.fileno()
        try:
            self._sock.sendmsg(
                [encode(offer)],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
                0,
                address(self._supervisor, home),
            )
        except OSError as error:
            log.debug("hand-over to worker %d not sent: %r", home, error)
            self._keep(state)
            return
        del self._candidates[state]
        recording.offered = True
        self._offers[serial] = _Offer(state, deadline)
        reading.update(transport, selectable, reactor_now(selectable))
        self._container.schedule(TIMEOUT, self)

    def _home(self, state: ConnectionState, frame: bytes) -> int | None:
        """The worker that owns the queue the ATTACH names, if the connection may go there."""
        vhost = state.vhost
        connection = state.connection
        if (
            vhost is None
            or len(state.sessions) != 1
            or state.publishers
            or state.fresh_links
            or state.temporary
            or state.inbound is not None
            or not _open(connection.state)
            or not all(_open(session.session.state) for session in state.sessions.values())
        ):
            return None
        link = attach_address(frame)
        if link is None or link.address is None or link.address == MANAGEMENT:
            return None
        try:
            named = parse_address(link.address) if link.receiver else parse_target(link.address)
        except AmqpError:
            return None
        if not isinstance(named, QueueAddress):
            return None
        queue = vhost.registry.get(named.queue)
        if isinstance(queue, RemoteQueue):
            return queue.remote.home if queue.remote.up else None
        peers = self._broker.peers
        if queue is not None or peers is None or not self._declares:
            return None
        # Not declared yet: the ATTACH would declare it, placed where the hash proposes
        # (docs/workers.md#placement), so it is declared there instead.
        home = proposed_home(vhost.name, named.queue, peers.spec.workers)
        remote = peers.remotes.get(home)
        return home if remote is not None and remote.up else None

    def _resume(self, state: ConnectionState) -> None:
        """Serve the connection here: proton gets the ATTACH and what followed it."""
        self._candidates.pop(state, None)
        recording = state.recording
        state.recording = None
        if recording is None or state.closed:
            return
        kept = recording.give_up()
        selectable = state.selectable
        if selectable.is_terminal or transport_of(selectable) is None:
            return
        if kept:
            feed(state, state.transport, kept)
        reading.update(state.transport, selectable, reactor_now(selectable))

    def _keep(self, state: ConnectionState) -> None:
        """A hand-over that did not happen: the connection is served here, crossing."""
        self.kept += 1
        self._resume(state)

    def _let_go(self, state: ConnectionState) -> None:
        """The taker has the connection: drop it here without writing a byte."""
        state.recording = None
        self.given += 1
        self._drop(state)

    def _drop(self, state: ConnectionState) -> None:
        """Forget a connection without a frame; its socket closes here only (the other worker
        holds its own descriptor of it)."""
        self._broker.release_connection(state)
        gate = getattr(state.selectable, "gate", None)
        if gate is not None:
            gate.abandon()
            gate.output.clear()
            gate.closing = True
        transport = state.transport
        transport.close_tail()
        transport.close_head()
        state.arrival = None  # closed: nothing of it can be written any more
        selectable = state.selectable
        if not selectable.is_terminal and transport_of(selectable) is not None:
            reading.update(transport, selectable, reactor_now(selectable))

    # -- messages -------------------------------------------------------------------------

    def on_selectable_readable(self, event: Event) -> None:
        """Read every message waiting."""
        self._receive()

    def _receive(self) -> None:
        space = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(_CREDENTIALS)
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(_DATAGRAM, space)
            except BlockingIOError:
                return
            except OSError as error:
                log.warning("hand-over socket: %r", error)
                return
            fds: list[int] = []
            sender: tuple[int, int] | None = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds.extend(array.array("i", payload[:usable]))
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid, uid, _ = array.array("i", payload[:_CREDENTIALS])
                    sender = (pid, uid)
            if sender is None or not self._sibling(*sender):
                log.warning("a hand-over message from a process that is no sibling worker")
                _close_all(fds)
                continue
            try:
                message = decode_message(data)
            except HandoverError as error:
                log.warning("a hand-over message dropped: %s", error)
                _close_all(fds)
                continue
            if message.kind is Kind.OFFER and len(fds) == 1:
                self._offered_to_us(message, fds[0])
                continue
            _close_all(fds)
            self._answer(message)

    def _sibling(self, pid: int, uid: int) -> bool:
        """Whether ``pid`` is a worker of this server: same user, same supervisor."""
        if uid != os.getuid():
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return int(stat.rsplit(")", 1)[1].split()[1]) == self._supervisor

    def _send(self, worker: int, message: Message) -> bool:
        try:
            self._sock.sendto(encode(message), address(self._supervisor, worker))
        except OSError as error:
            log.debug("hand-over message to worker %d not sent: %r", worker, error)
            return False
        return True

    def _answer(self, message: Message) -> None:
        kind = message.kind
        if kind is Kind.READY:
            self._ready(message)
        elif kind is Kind.REFUSE:
            offer = self._offers.pop(message.serial, None)
            if offer is not None:
                self._keep(offer.state)
        elif kind in (Kind.GO, Kind.ABORT):
            arrival = self._arrivals.pop((message.worker, message.serial), None)
            if arrival is not None:
                if kind is Kind.GO:
                    self._take(arrival)
                else:
                    self._drop(arrival.state)

    def _ready(self, message: Message) -> None:
        offer = self._offers.pop(message.serial, None)
        abort = Message(Kind.ABORT, self._index, message.serial, 0.0)
        if offer is None:
            self._send(message.worker, abort)  # given up meanwhile: the taker drops its copy
            return
        state = offer.state
        if state.closed or time.monotonic() >= offer.deadline:
            self._send(message.worker, abort)
            self._keep(state)
            return
        if self._send(message.worker, Message(Kind.GO, self._index, message.serial, 0.0)):
            self._let_go(state)
        else:
            # The taker never gets GO: it drops its copy at its deadline.
            self._keep(state)

    def on_timer_task(self, event: Event) -> None:
        """Offers not answered in time are served here; arrivals not let go are dropped."""
        self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        for serial, offer in list(self._offers.items()):
            if now >= offer.deadline:
                del self._offers[serial]
                self._keep(offer.state)
        if any(now >= arrival.deadline for arrival in self._arrivals.values()):
            self._receive()  # a GO sent before the giver's deadline is read first
            for key, arrival in list(self._arrivals.items()):
                if now >= arrival.deadline:
                    del self._arrivals[key]
                    log.info("a connection offered by worker %d was not let go", key[0])
                    self._drop(arrival.state)
        # proton's timers run on the clock its reactor read at the start of its pass, which may
        # be behind this one: a timer can fire before the deadline it was set for, which then
        # had none (an offer to a stopped worker waited for good, not TIMEOUT; CI rehearsal of
        # test_an_offer_beyond_the_bound_keeps_its_worker_at_once). One timer more, at most, is
        # set for the earliest deadline left.
        deadlines = [offer.deadline for offer in self._offers.values()]
        deadlines.extend(arrival.deadline for arrival in self._arrivals.values())
        again = self._again
        if deadlines and not again.set:
            again.set = True
            self._container.schedule(min(deadlines) - now, again)

    # -- taking ---------------------------------------------------------------------------

    def _offered_to_us(self, message: Message, fd: int) -> None:
        sock = socket.socket(fileno=fd)
        refuse = Message(Kind.REFUSE, self._index, message.serial, 0.0)
        listener = self.listener
        key = (message.worker, message.serial)
        try:
            peer = sock.getpeername()
        except OSError:
            peer = None  # the client left meanwhile
        if (
            peer is None
            or listener is None
            or len(self._arrivals) >= self._max_pending
            or key in self._arrivals
            or message.deadline - time.monotonic() < MIN_LEFT
            or not self._broker.handshakes.admit()
        ):
            sock.close()
            self._send(message.worker, refuse)
            return
        state = listener.serve(sock, str(peer[0]), recorded=False)
        read = message.read
        split = len(read) - message.held
        arrival = _Arrival(
            key,
            state,
            Expected(message.written),
            read[split:],
            message.deadline + GRACE,
        )
        self._arrivals[key] = arrival
        state.arrival = arrival
        gate = getattr(state.selectable, "gate", None)
        if gate is not None:
            gate.replay(read[:split])
        selectable = state.selectable
        if not selectable.is_terminal and transport_of(selectable) is not None:
            reading.update(state.transport, selectable, reactor_now(selectable))
        self._container.schedule(arrival.deadline - time.monotonic(), self)

    def _check_arrival(self, arrival: _Arrival) -> None:
        if arrival.ready:
            return
        state = arrival.state
        key = arrival.key
        refuse = Message(Kind.REFUSE, self._index, key[1], 0.0)
        if state.closed or arrival.expected.failed:
            del self._arrivals[key]
            if state.closed:
                state.arrival = None
            else:
                log.info("a connection offered by worker %d differs here: refused", key[0])
                self._drop(state)
            self._send(key[0], refuse)
            return
        gate = getattr(state.selectable, "gate", None)
        if (
            not arrival.expected.done
            or state.transport.pending() > 0
            or (gate is not None and gate.output)
        ):
            return
        arrival.ready = True
        if not self._send(key[0], Message(Kind.READY, self._index, key[1], 0.0)):
            del self._arrivals[key]
            self._drop(state)

    def _take(self, arrival: _Arrival) -> None:
        """GO: serve the connection from its ATTACH on."""
        state = arrival.state
        state.arrival = None
        if state.closed:
            return
        self.taken += 1
        selectable = state.selectable
        if selectable.is_terminal or transport_of(selectable) is None:
            return
        feed(state, state.transport, arrival.tail)
        reading.update(state.transport, selectable, reactor_now(selectable))


def _open(endpoint_state: int) -> bool:
    """Whether a connection or session is open both ways (answered, not closing)."""
    return bool(endpoint_state & Endpoint.LOCAL_ACTIVE) and not endpoint_state & (
        Endpoint.REMOTE_CLOSED
    )


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
