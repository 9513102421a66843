"""The reactor's IO handler, extended with what flow control needs from the socket.

- Bytes really written are counted and reported to the connection's writer ledger, which gives
  frame credit back to sessions (proton's own output buffer is unbounded: docs/design.md).
- Every read from a connection re-checks its sessions with deliveries waiting: a client reopens
  its incoming window with a session-only FLOW, for which proton raises no event. A frame read
  also ends the hold on credit granted with a consumer's ATTACH (gateway/rules/credit_hold.py),
  whose deadline is the connection's too.
- Sessions with something new to send are pumped before the reactor blocks in ``select``.
- A connection whose account is over its limit, or which the memory budget holds, is not read
  (gateway/reading.py); bytes read from a publishing connection are charged to the budget as
  they are read (session/inbound_flow.py).
- Until its SASL exchange is done, and for its lifetime under TLS, a connection's bytes pass
  through its gate (gateway/gate.py), read within the same bounds per pass.
- The reactor waits in epoll (:mod:`gateway.selector`), not select(): no limit of 1,024 sockets.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import sys
import termios
from typing import Final, Protocol

from proton import Condition, Endpoint, Event, Transport
from proton.handlers import IOHandler
from proton.reactor import Container

from sluicegate.gateway import reading
from sluicegate.gateway.broker import Broker
from sluicegate.gateway.feeding import feed, output, taken
from sluicegate.gateway.gate import Gate
from sluicegate.gateway.proton.internals import (
    Selectable,
    forget_transport,
    reactor_now,
    selectable_of,
    transport_of,
)
from sluicegate.gateway.rare_warning import CLIENT_BURST, RareWarning
from sluicegate.gateway.reading import READ_BATCH
from sluicegate.gateway.selector import EpollSelector
from sluicegate.gateway.state import ConnectionState, forget_selectable

log = logging.getLogger("sluicegate.io")


def _client_line(message: str) -> RareWarning:
    """A line each client closed so would write, within the burst of its kind."""
    return RareWarning(message, burst=CLIENT_BURST, level=logging.INFO, logger=log)


_LEFT_UNREAD = _client_line("closing a connection whose client left")
_CLOSE_UNREAD = _client_line("closing a held connection whose client sent CLOSE")
_FIRST_UNDECODED = _client_line("dropping a client before its OPEN")
_UNDECODED = _client_line("closing a connection with amqp:decode-error")
_HANDSHAKE = _client_line("dropping a client at handshake_timeout")
_IDLE = _client_line("closing a connection at idle_timeout")
_SEND = _client_line("dropping a client at send_timeout")

# Frames taken from one connection per readiness. Proton raises events for every frame pushed
# and the reactor handles them all before it looks at another socket; an ATTACH costs about a
# thousand times a TRANSFER there, so a burst of small control frames (thousands fit in
# READ_BATCH) would stall everyone for seconds. 64 keeps a pass of the costliest frames short
# and still moves hundreds of transfers per pass.
READ_FRAMES: Final = 64
# Bytes per recv: the frame count is checked between reads, so this bounds the overshoot.
READ_CHUNK: Final = 16 * 1024
# Bytes written to one connection per writability. Proton frames at most the client's
# max-frame-size per ``pending()`` (32 KiB for proton's own clients), so a busy consumer's output
# took a full pass of the reactor per 32 KiB while the socket would take more; this writes on
# until the socket is full, proton has nothing framed, or the batch is used up, so that one
# connection does not hold the others up for long.
WRITE_BATCH: Final = 256 * 1024


class DirectHandler(Protocol):
    """A selectable's handler that the reactor's readiness reaches without proton's events."""

    def readable(self) -> None: ...

    def writable(self) -> None: ...


class FlowIO(IOHandler):
    """proton's ``IOHandler`` plus byte accounting and a flush before blocking."""

    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self._epoll = EpollSelector()
        # IOHandler's methods use the selector through this attribute, by its interface.
        self._selector = self._epoll  # type: ignore[assignment]
        self.broker = broker
        # Selectables whose readiness goes straight to their handler (internals.register).
        self.direct: dict[Selectable, DirectHandler] = {}

    # Proton declares it static, but calls it as ``self.update``: this one needs the selector.
    def update(  # type: ignore[override]
        self, transport: Transport, selectable: Selectable, now: float
    ) -> None:
        """What proton calls after every read, write and transport event: a connection whose
        account is paused stays unread whatever its transport's capacity (gateway/reading.py).

        The selector takes the socket's new interest at once: proton's way, a
        ``selectable_updated`` event, was a third of all the events the reactor dispatched
        while a consumer read a stream. A socket done with still goes through proton's event.
        """
        reading.watch(transport, selectable, now)
        if selectable.is_terminal:
            selectable.update()
        else:
            self._epoll.update(selectable)

    def close(self) -> None:
        """Release the selector once the reactor has stopped."""
        self._epoll.close()

    def on_reactor_quiesced(self, event: Event) -> None:
        self.quiesce(event.reactor)

    def quiesce(self, reactor: Container) -> None:
        """Flush sessions first; block in select only if that produced no new events. The
        reactor calls it once it has no event left (gateway/proton/reactor.py).

        Proton's own handler, but for the selectables registered ``direct`` (the channels
        between workers, gateway/proton/channel_socket.py): their readiness is handed to them
        at once, not pushed as an event to wrap and dispatch to their handler and to this one.
        """
        self.broker.flush()
        if not _quiet(reactor):
            return
        # As proton's handler: cancelled timers leave the heap before the wait.
        reactor.timer_deadline  # noqa: B018
        readable, writable, expired = self._epoll.select(reactor.timeout)
        reactor.mark()
        direct = self.direct
        for selectable in readable:
            handler = direct.get(selectable)
            if handler is None:
                selectable.readable()
            else:
                self._epoll.left(selectable)
                handler.readable()
        for selectable in writable:
            handler = direct.get(selectable)
            if handler is None:
                selectable.writable()
            else:
                handler.writable()
        for selectable in expired:
            selectable.expired()
        reactor.yield_()

    def on_selectable_readable(self, event: Event) -> None:
        """Read what the socket has, then look again at sessions that were waiting on the window.

        A connection whose client left while it was not read (its reads paused) is closed
        unread: what it sent meanwhile has no one to answer, and what it holds is freed now
        rather than when the hold ends.
        """
        gate: Gate | None = getattr(event.selectable, "gate", None)
        if gate is None and transport_of(event.selectable) is None:
            # A pipe or a channel between workers (gateway/proton/channel_socket.py): its own
            # handler has read it, a peer that left included.
            self._epoll.left(event.selectable)
            return
        if self._epoll.left(event.selectable):
            _LEFT_UNREAD.happened(reactor_now(event.selectable), "while it was not read")
            if gate is not None:
                gate.abandon()
            self.on_selectable_error(event)
            return
        if gate is None:
            self._read(event)
        elif not self._read_gate(event, gate):
            return
        state: ConnectionState | None = getattr(event.selectable, "sg", None)
        if state is not None:
            if state.credit_hold:
                self.broker.credit_heard(state)
            if state.transport.capacity() < 0:
                self._input_ended(state)
            for session in state.sessions.values():
                if session.pure.outgoing_pending:
                    self.broker.mark(session)

    def _read(self, event: Event) -> None:
        """Read up to :data:`READ_BATCH` bytes or :data:`READ_FRAMES` frames.

        Proton reads one capacity (8 KiB until a frame needs more) per readiness, which costs a
        full pass of the reactor per 8 KiB; this reads on until the socket is empty, the batch
        or the frame allowance is used up, or the connection's account paused it.
        """
        selectable = event.selectable
        transport = transport_of(selectable)
        if not transport:
            return
        state: ConnectionState | None = getattr(selectable, "sg", None)
        if state is not None:
            if state.reads_paused:
                self._read_ahead(event, state, transport, None)
                return
            if state.held.data:
                feed(state, transport, state.held.take())
        publishing = self.broker.publishing
        left = READ_BATCH
        frames_before = transport.frames_input
        while left > 0:
            if state is not None and state.reads_paused:
                break
            capacity = transport.capacity()
            if capacity <= 0:
                break
            data = self._recv(event, transport, min(capacity, left, READ_CHUNK))
            if data is None:
                break
            if not data:
                return
            if state is None:
                transport.push(data)
            else:
                recording = state.recording
                if recording is not None:
                    recording.took(data)
                feed(state, transport, data)
                if state.recording is not None and state.recording.attach is not None:
                    break  # its first ATTACH waits (gateway/handover.py)
            left -= len(data)
            if state is not None:
                # Charged before proton's events are handled: see session/inbound_flow.py.
                publishing.charge_read(state, len(data))
            if transport.frames_input - frames_before >= READ_FRAMES:
                break
        now = reactor_now(selectable)
        if state is not None:
            state.deadlines.frames_read(now, transport.frames_input)
        self.update(transport, selectable, now)

    def _read_ahead(
        self, event: Event, state: ConnectionState, transport: Transport, gate: Gate | None
    ) -> bool:
        """Read a held connection's socket into its held bytes, at most ``HELD_READ`` of them
        (through TLS, plus the rest of a record), and give proton the frames at their start
        that free things (wire/held_frames.py); False once the connection is gone.

        A held client that says CLOSE, END or DETACH is heard, though the hold may never end;
        one that floods it with transfers has read of them what the buffer takes, no more.
        """
        selectable = event.selectable
        if state.recording is not None:
            # Held before its first ATTACH: it keeps its worker (gateway/handover.py).
            kept = state.recording.give_up()
            state.recording = None
            if kept:
                feed(state, transport, kept)
        held = state.held
        left = READ_BATCH
        frames_before = transport.frames_input
        while left > 0 and state.reads_paused and reading.reads_ahead(state, selectable):
            size = min(held.room, READ_CHUNK)
            if gate is not None:
                # The gate puts the plaintext in the held bytes while the connection is held.
                if not gate.read(selectable, transport, size):
                    gate.abandon()
                    self.on_selectable_error(event)
                    return False
                received = gate.received
                if not received:
                    break
            else:
                data = self._recv(event, transport, size)
                if data is None:
                    break
                if not data:
                    return False
                held.data += data
                received = len(data)
            left -= received
            self.broker.publishing.charge_read(state, received)
            if not self._free_held(state, transport):
                break
            if transport.frames_input - frames_before >= READ_FRAMES:
                break
        if gate is not None:
            self._after_gate(selectable, gate, transport)
        else:
            self.update(transport, selectable, reactor_now(selectable))
        return True

    def _recv(self, event: Event, transport: Transport, size: int) -> bytes | None:
        """Up to ``size`` bytes of the socket. None: nothing now (it would block, or it failed
        and the transport's tail is closed); empty: the client ended, its error handled."""
        try:
            data: bytes = event.selectable.recv(size)
        except BlockingIOError:
            return None
        except OSError as error:
            log.debug("recv failed: %r", error)
            transport.close_tail()
            return None
        if not data:
            self.on_selectable_error(event)
        return data

    def _free_held(self, state: ConnectionState, transport: Transport) -> bool:
        """Give proton the frames that free things at the start of the held bytes, or close
        the connection for a CLOSE behind others; False once nothing more is to be read."""
        cut = state.dispositions.cut()
        if cut is None:
            return False
        held = state.held
        found = held.scan(*cut)
        if found.free:
            feed(state, transport, held.pop(found.free))
        if not found.close:
            return True
        unread = len(held.take())
        _CLOSE_UNREAD.happened(reactor_now(state.selectable), f"behind {unread} bytes not read")
        self.broker.release_connection(state)
        why = "its account" if state.account.paused else "the memory budget"
        condition = Condition(
            "amqp:resource-limit-exceeded",
            f"CLOSE came while {why} held the connection unread: "
            f"the frames before it were not read ({unread} bytes of them at least)",
        )
        transport.condition = state.connection.condition = condition
        state.connection.close()
        transport.close_tail()
        return False

    def _input_ended(self, state: ConnectionState) -> None:
        """Close with ``amqp:decode-error`` a connection whose frame proton could not decode.

        Proton stops reading on a frame whose performative it cannot decode (a body that is
        not a described list, an unknown descriptor, a field of the wrong type) but sets no
        condition and sends nothing, so the client would wait for an answer that never comes.
        A tail closed with no condition and no CLOSE from the client means exactly that.
        Before the client's OPEN, proton cannot send CLOSE, so the connection is dropped.
        """
        transport = state.transport
        connection = state.connection
        if transport.condition is not None or connection.state & Endpoint.REMOTE_CLOSED:
            return
        if connection.state & Endpoint.LOCAL_CLOSED:
            return
        self.broker.release_connection(state)
        if connection.state & Endpoint.REMOTE_UNINIT:
            # Proton sends no CLOSE before the client's OPEN: the connection is dropped.
            _FIRST_UNDECODED.happened(
                reactor_now(state.selectable), "its first frame could not be decoded"
            )
            transport.close_head()
            return
        _UNDECODED.happened(
            reactor_now(state.selectable), "it sent a frame proton could not decode"
        )
        connection.condition = Condition("amqp:decode-error", "a frame could not be decoded")
        connection.close()

    def on_selectable_writable(self, event: Event) -> None:
        """Write what proton has framed, up to :data:`WRITE_BATCH`, counting the bytes that
        reached the socket."""
        selectable = event.selectable
        gate: Gate | None = getattr(selectable, "gate", None)
        state: ConnectionState | None = getattr(selectable, "sg", None)
        if state is not None:
            if state.arrival is not None:
                self._absorb(state, selectable, gate)
                return
            if state.recording is not None and state.recording.offered:
                return  # offered to another worker: nothing is written until it answers
        if gate is not None:
            self._write_gate(selectable, gate)
            return
        transport = transport_of(selectable)
        if not transport:
            return
        first = pending = transport.pending()
        left = WRITE_BATCH
        while pending > 0 and left > 0:
            data = output(state, transport, pending)
            if not data:
                break
            try:
                written = selectable.send(data)
            except BlockingIOError:
                break
            except OSError as error:
                log.debug("send failed: %r", error)
                transport.close_head()
                break
            taken(state, transport, written)
            pending = transport.pending()
            if state is not None:
                if state.recording is not None:
                    state.recording.wrote(data[:written])
                self._written(state, written, pending)
            if written < len(data):
                break
            left -= written
        if transport.pending() != first:
            self.update(transport, selectable, reactor_now(selectable))

    def _absorb(self, state: ConnectionState, selectable: Selectable, gate: Gate | None) -> None:
        """A connection another worker hands over: what its server writes is checked against
        what that worker wrote, never sent (gateway/handover.py)."""
        arrival = state.arrival
        assert arrival is not None
        if gate is not None and gate.output:
            arrival.absorb(state, bytes(gate.output))
            gate.output.clear()
        transport = transport_of(selectable)
        if transport is not None:
            pending = transport.pending()
            while pending > 0:
                data = output(state, transport, pending)
                if not data:
                    break
                taken(state, transport, len(data))
                pending = transport.pending()
                self._written(state, len(data), pending)
                arrival.absorb(state, data)
        if gate is not None:
            self._after_gate(selectable, gate, transport)
        elif transport is not None:
            self.update(transport, selectable, reactor_now(selectable))

    def _read_gate(self, event: Event, gate: Gate) -> bool:
        """Read through the connection's TLS and SASL; False once the connection is gone.

        The bounds of :meth:`_read` hold here too: reads of :data:`READ_CHUNK` at most (the
        gate passes on their plaintext, plus the rest of a TLS record begun before), charged
        as they are read, until the socket is empty, :data:`READ_BATCH` or :data:`READ_FRAMES`
        is used up, or the connection is paused or closing.
        """
        selectable = event.selectable
        transport = transport_of(selectable)
        if transport is None:
            return False
        state: ConnectionState | None = getattr(selectable, "sg", None)
        if state is not None:
            if state.reads_paused:
                return self._read_ahead(event, state, transport, gate)
            if state.held.data:
                feed(state, transport, state.held.take())
        publishing = self.broker.publishing
        left = READ_BATCH
        frames_before = transport.frames_input
        while True:
            size = min(left, READ_CHUNK)
            if not gate.read(selectable, transport, size):
                gate.abandon()
                self.on_selectable_error(event)
                return False
            received = gate.received
            left -= received
            if state is not None:
                publishing.charge_read(state, received)
                if state.reads_paused:
                    break
            if (
                received < size
                or left <= 0
                or gate.closing
                or not gate.readable
                or transport.capacity() < 0
                or transport.frames_input - frames_before >= READ_FRAMES
            ):
                break
        if state is not None:
            state.deadlines.frames_read(reactor_now(selectable), transport.frames_input)
        self._after_gate(selectable, gate, transport)
        return True

    def _write_gate(self, selectable: Selectable, gate: Gate) -> None:
        transport = transport_of(selectable)
        taken = gate.write(selectable, transport)
        state: ConnectionState | None = getattr(selectable, "sg", None)
        if taken and state is not None and transport is not None:
            self._written(state, taken, transport.pending())
        self._after_gate(selectable, gate, transport)

    def _after_gate(self, selectable: Selectable, gate: Gate, transport: Transport | None) -> None:
        if gate.closing and not gate.output:
            if transport is not None:
                transport.close_tail()
                transport.close_head()
            else:
                selectable.terminate()
                selectable.update()
                return
        if gate.removable:
            setattr(selectable, "gate", None)  # noqa: B010
        if transport is not None:
            self.update(transport, selectable, reactor_now(selectable))
        elif not selectable.is_terminal:
            selectable.writing = gate.wants_write
            selectable.update()

    def on_selectable_final(self, event: Event) -> None:
        """The socket is closed and out of the selector: what it held of its connection goes."""
        super().on_selectable_final(event)
        self.direct.pop(event.selectable, None)
        forget_selectable(event.selectable)

    def on_selectable_expired(self, event: Event) -> None:
        """Drop a client past its handshake or idle timeout (gateway/rules/timeouts.py)."""
        selectable = event.selectable
        transport = transport_of(selectable)
        state: ConnectionState | None = getattr(selectable, "sg", None)
        if transport is None or state is None:
            return
        now = reactor_now(selectable)
        if state.credit_hold:
            self.broker.credit_due(state, now)
        overdue = state.deadlines.overdue(now, state.reads_paused)
        if overdue == "handshake":
            _HANDSHAKE.happened(now, "it did not log in and open in time")
            gate: Gate | None = getattr(selectable, "gate", None)
            if gate is not None:
                gate.abandon()
                gate.closing = True
            self.broker.release_connection(state)
            transport.close_tail()
            transport.close_head()
        elif overdue == "idle":
            _IDLE.happened(now, "it sent no frame for that long")
            self.broker.release_connection(state)
            # Proton's CLOSE carries the transport's condition once input ends; no CLOSE will
            # come back from a silent client, so the connection ends once ours is written.
            condition = Condition(
                "amqp:resource-limit-exceeded",
                f"no frame from the client for {state.deadlines.idle_timeout:g} s (idle_timeout)",
            )
            transport.condition = state.connection.condition = condition
            state.connection.close()
            transport.close_tail()
        elif overdue == "send":
            if state.deadlines.send_stuck(now, kernel_queued(selectable)):
                _SEND.happened(now, "it read nothing for that long")
                # No CLOSE would reach it; what proton holds for it goes with the connection
                # (gateway/rules/timeouts.py).
                self.broker.release_connection(state)
                transport.close_tail()
                transport.close_head()
        elif overdue == "credential":
            # RabbitMQ closes an AMQP 1.0 connection whose token expired the same way.
            self.broker.release_connection(state)
            condition = Condition("amqp:unauthorized-access", "credential expired")
            state.connection.condition = condition
            state.connection.close()
        super().on_selectable_expired(event)

    def on_transport_closed(self, event: Event) -> None:
        """Proton is done with the connection; TLS bytes still waiting are written first."""
        transport = event.transport
        selectable = None if transport is None else selectable_of(transport)
        gate: Gate | None = getattr(selectable, "gate", None)
        if transport is None or selectable is None or gate is None or not gate.output:
            super().on_transport_closed(event)
            return
        gate.closing = True
        forget_transport(transport)
        transport.unbind()
        selectable.reading = False
        selectable.writing = True
        selectable.update()

    def _written(self, state: ConnectionState, written: int, still_pending: int) -> None:
        if written:
            state.deadlines.wrote(reactor_now(state.selectable))
        if state.fresh_links:
            now = reactor_now(state.selectable)
            self.broker.attaches_written(state, now)
            if state.credit_hold:
                # The end of the hold is the socket's deadline too (gateway/reading.py).
                self.update(state.transport, state.selectable, now)
        writer = state.writer
        unblocked = writer.written(written)
        if not still_pending:
            held = sum(s.session.outgoing_bytes for s in state.sessions.values())
            unblocked += writer.caught_up(held)
            # A session's window is read less what proton held unframed (SessionState
            # .refresh_window); now that proton has written everything, look at it again,
            # and so do links stalled on it (session/outbound.py ``Session.stall``).
            for waiting in state.sessions.values():
                pure = waiting.pure
                if (pure.remote_incoming_window <= 0 and pure.outgoing_pending) or (
                    pure.stalled_links
                ):
                    self.broker.mark(waiting)
        for credit in unblocked:
            session = state.sessions.get(credit)
            if session is not None:
                self.broker.mark(session)
        if state.waiting in state.waiting.server.starved:
            # What it asked another worker for waited on its unsent bytes (session/waiting.py).
            self.broker.sending.resume(state)


def kernel_queued(selectable: Selectable) -> int:
    """The bytes the kernel still queues for the socket, sent or not, unacknowledged
    (``SIOCOUTQ``): they go down only as the client reads; -1 if the socket cannot tell."""
    try:
        queued = fcntl.ioctl(selectable.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return -1
    return int.from_bytes(queued, sys.byteorder, signed=True)


def _quiet(reactor: Container) -> bool:
    """Whether the reactor has no event to handle but a quiesced one (a flush may make some)."""
    return bool(reactor.quiesced)


def listen_socket(host: str, port: int, backlog: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking listening socket with a real backlog (proton's own uses 10);
    ``reuse_port``: one of several workers' sockets on the port, among which the kernel spreads
    new connections (SO_REUSEPORT, gateway/supervisor.py)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock
