"""A blocking, frame-level AMQP 1.0 client for flow-control tests.

Proton's reactor clients read the socket eagerly, never send ``echo`` and cannot close a session
incoming-window and reopen it later, yet the server's flow-control tests (RabbitMQ's
``amqp_client_SUITE`` scenarios) need all three. This client writes exactly the frames a test asks
for and reads the socket only while a test calls one of its reading methods, so "stop reading" is
simply not calling them. ``proton.Data`` is the type codec; everything else is AMQP 1.0 part 2
(transport) done by hand.

Every frame read is applied to the client's view of the connection (``sessions``, ``links``) and
appended to ``received``, whichever method read it, so tests can check frame order afterwards.
Decoded fields use the spec's field names with ``_`` for ``-``; ``None`` means the peer omitted the
field (its spec default applies).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Self

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, uint, ulong
from proton._data import PythonAMQPData

from .frames import (
    AMQP_FRAME,
    AMQP_HEADER,
    FRAME_HEADER,
    HEARTBEAT,
    MIN_MAX_FRAME_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    AmqpError,
    Composite,
    Frame,
    ProtocolError,
    described,
    encode,
    encode_frame,
    parse_frame,
    symbol_map,
)

__all__ = [
    "AmqpError",
    "Attached",
    "Composite",
    "ConnectionClosedError",
    "Delivery",
    "Frame",
    "LinkState",
    "Outcome",
    "PeerClosedError",
    "ProtocolError",
    "RawClient",
    "Role",
    "SessionState",
]

SERIAL_BITS: Final = 32  # §2.8.9 sequence-no: RFC-1982 serial numbers over uint
DEFAULT_WINDOW: Final = 2**31 - 1  # what proton advertises: effectively unbounded, no wrap-around
DEFAULT_TIMEOUT: Final = 5.0  # RabbitMQ's suite fails any single wait longer than 5 s
RECV_SIZE: Final = 65536  # bytes per recv(); a small SO_RCVBUF caps it anyway
SASL_OK: Final = 0  # §5.3.3.6 sasl-code "ok"
MESSAGE_FORMAT: Final = 0  # §2.7.5: format 0 is the standard AMQP message of part 3

Role = Literal["sender", "receiver"]
# An outcome for disposition(); modified carries (delivery-failed, undeliverable-here).
# A modified outcome: delivery-failed, undeliverable-here and perhaps message-annotations.
Outcome = (
    Literal["accepted", "released", "rejected"]
    | tuple[Literal["modified"], bool, bool]
    | tuple[Literal["modified"], bool, bool, dict[symbol, object]]
    | None
)


class ConnectionClosedError(ConnectionError):
    """The peer closed the TCP connection."""


class PeerClosedError(Exception):
    """The peer sent CLOSE while the test waited for something else."""

    def __init__(self, frame: Frame) -> None:
        super().__init__(f"peer closed the connection: {frame.fields.get('error')}")
        self.frame = frame


@dataclass(frozen=True)
class Delivery:
    """A whole message, reassembled from its TRANSFER frames; ``handle`` is our handle."""

    handle: int
    delivery_id: int
    tag: bytes
    settled: bool
    payload: bytes
    frames: int


@dataclass(frozen=True)
class Attached:
    """The peer's answer to our ATTACH, plus the DETACH error if it refused the link (§2.6.3)."""

    frame: Frame
    error: Composite | None

    @property
    def source(self) -> Composite | None:
        source: Composite | None = self.frame["source"]
        return source

    @property
    def target(self) -> Composite | None:
        target: Composite | None = self.frame["target"]
        return target

    @property
    def source_address(self) -> str | None:
        return None if self.source is None else self.source["address"]

    @property
    def target_address(self) -> str | None:
        return None if self.target is None else self.target["address"]


@dataclass
class SessionState:
    """Our endpoint of one session: the §2.5.6 session flow-control variables."""

    channel: int
    next_outgoing_id: int
    incoming_window: int
    outgoing_window: int
    initial_outgoing_id: int
    remote_channel: int | None = None
    next_incoming_id: int | None = None
    remote_incoming_window: int = 0
    remote_outgoing_window: int = 0
    next_delivery_id: int = 0
    # Outcomes the peer reported for our deliveries, by delivery-id.
    outcomes: dict[int, Composite | None] = field(default_factory=dict)
    # The peer's handles of attached links; §2.6.2: a handle is free again after DETACH.
    remote_handles: dict[int, LinkState] = field(default_factory=dict)
    begin_reply: Frame | None = None
    end_frame: Frame | None = None


@dataclass
class LinkState:
    """Our endpoint of one link: the §2.6.7 link flow-control variables, seen from our role."""

    handle: int
    name: str
    role: Role
    channel: int
    delivery_count: int
    link_credit: int = 0
    drain: bool = False
    available: int | None = None
    remote_handle: int | None = None
    attach_reply: Frame | None = None
    detach_frame: Frame | None = None
    # The TRANSFER frames of a delivery still arriving (its last one had more=true).
    partial: list[Frame] = field(default_factory=list)


def _serial(n: int) -> int:
    return n % (1 << SERIAL_BITS)


def _serial_diff(a: int, b: int) -> int:
    """a - b in RFC-1982 serial arithmetic, so credit stays right across wrap-around."""
    d = _serial(a - b)
    return d - (1 << SERIAL_BITS) if d >= 1 << (SERIAL_BITS - 1) else d


def _outcome(state: Outcome) -> Described | None:
    if state is None:
        return None
    if isinstance(state, tuple):
        failed, undeliverable = state[1], state[2]
        if len(state) == 4:
            return described(
                "modified",
                delivery_failed=failed,
                undeliverable_here=undeliverable,
                message_annotations=state[3],  # type: ignore[arg-type]
            )
        return described("modified", delivery_failed=failed, undeliverable_here=undeliverable)
    return described(state)


class RawClient:
    """One AMQP 1.0 connection over a plain blocking socket; see the module docstring."""

    def __init__(self, sock: socket.socket, *, max_frame_size: int) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._last_sent = time.monotonic()
        self._corked: list[bytes] | None = None
        self.max_frame_size = max_frame_size
        self.write_timeout = DEFAULT_TIMEOUT
        self.peer_max_frame_size = MIN_MAX_FRAME_SIZE
        self.peer_idle_timeout_ms: int | None = None
        self.peer_open: Frame | None = None
        self.peer_close: Frame | None = None
        self.received: list[Frame] = []
        self.sessions: dict[int, SessionState] = {}
        self.links: dict[int, LinkState] = {}
        self._by_remote_channel: dict[int, SessionState] = {}
        self._deliveries: deque[Delivery] = deque()

    @property
    def local_port(self) -> int:
        """This end's port: which worker accepted the connection (tests/support/workers.py)."""
        port: int = self._sock.getsockname()[1]
        return port

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        *,
        sasl: bool = True,
        max_frame_size: int = 65536,
        rcvbuf: int | None = None,
        container_id: str = "sluicegate-raw-client",
        idle_timeout_ms: int | None = None,
        hostname: str | None = None,
        properties: Mapping[str, PythonAMQPData] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        plain: tuple[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> RawClient:
        """Open a connection: TLS with ``tls``, headers, SASL (PLAIN with ``plain`` (user,
        password), else ANONYMOUS) if ``sasl``, then OPEN both ways.

        ``rcvbuf`` is set before connecting because the TCP window scale is fixed at the
        handshake; a small one makes the server feel back-pressure as soon as we stop reading.
        """
        if max_frame_size < MIN_MAX_FRAME_SIZE:
            raise ValueError(f"max_frame_size must be at least {MIN_MAX_FRAME_SIZE}")
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            if rcvbuf is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeout)
            sock.connect(address)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
            client = cls(sock, max_frame_size=max_frame_size)
            if sasl:
                client._sasl_login(hostname, timeout, plain)
            client._exchange_header(AMQP_HEADER, timeout)
            client._send(
                0,
                described(
                    "open",
                    container_id=container_id,
                    hostname=hostname,
                    max_frame_size=uint(max_frame_size),
                    idle_time_out=None if idle_timeout_ms is None else uint(idle_timeout_ms),
                    properties=symbol_map(properties),
                ),
            )
            client.wait_for("open", timeout=timeout)
        except BaseException:
            sock.close()
            raise
        return client

    def _exchange_header(self, header: bytes, timeout: float) -> None:
        self.send_raw(header)
        deadline = time.monotonic() + timeout
        while len(self._buffer) < len(header):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no protocol header within {timeout} s")
            self._fill(deadline)
        answer = bytes(self._buffer[: len(header)])
        del self._buffer[: len(header)]
        if answer != header:
            raise ProtocolError(f"sent header {header!r}, peer answered {answer!r}")

    def _sasl_login(
        self, hostname: str | None, timeout: float, plain: tuple[str, str] | None
    ) -> None:
        self._exchange_header(SASL_HEADER, timeout)
        mechanisms = self.wait_for("sasl_mechanisms", timeout=timeout)["sasl_server_mechanisms"]
        offered = mechanisms if isinstance(mechanisms, list) else [mechanisms]
        mechanism = "ANONYMOUS" if plain is None else "PLAIN"
        if mechanism not in offered:
            raise ProtocolError(f"peer does not offer SASL {mechanism}: {offered}")
        response = b"" if plain is None else b"\0%s\0%s" % (plain[0].encode(), plain[1].encode())
        init = described(
            "sasl_init", mechanism=symbol(mechanism), initial_response=response, hostname=hostname
        )
        self._send(0, init, frame_type=SASL_FRAME)
        code = self.wait_for("sasl_outcome", timeout=timeout)["code"]
        if code != SASL_OK:
            raise ProtocolError(f"SASL {mechanism} refused with sasl-code {code}")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()

    def abort(self) -> None:
        """Drop the TCP connection without CLOSE, as a crashed client would."""
        self._sock.close()

    def reset(self, writer: threading.Thread | None = None, timeout: float = 10.0) -> None:
        """Reset the TCP connection, as the kernel does for a client killed with bytes unread
        or unsent; unlike :meth:`abort`, this reaches a peer that stopped reading, and wakes a
        thread blocked writing to it.

        That ``writer`` thread is joined before the descriptor is closed: closed under it, an
        SSL write goes on with the descriptor's number, which the next socket opened in this
        process reuses, and another client's connection receives the ciphertext.
        """
        sock = self._sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
        if writer is not None:
            writer.join(timeout)
            assert not writer.is_alive(), "the writing thread did not end after the reset"
        sock.close()

    # ----- writing -----

    @contextmanager
    def corked(self) -> Iterator[None]:
        """Hold every write made inside the block and send them in one ``sendall`` at its end.

        The server then reads many frames per socket read, as from a fast client, before it
        can answer any of them.
        """
        held: list[bytes] = []
        self._corked = held
        try:
            yield
        finally:
            self._corked = None
        self.send_raw(b"".join(held))

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (also for malformed-input tests); blocks while TCP is full."""
        if self._corked is not None:
            self._corked.append(data)
            return
        self._sock.settimeout(self.write_timeout)
        self._sock.sendall(data)
        self._last_sent = time.monotonic()

    def _send(self, channel: int, body: Described, *, frame_type: int = AMQP_FRAME) -> None:
        self.send_raw(encode_frame(channel, body, frame_type=frame_type))

    def begin(
        self,
        channel: int = 0,
        *,
        incoming_window: int = DEFAULT_WINDOW,
        outgoing_window: int = DEFAULT_WINDOW,
        next_outgoing_id: int = 0,
        handle_max: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> SessionState:
        """Send BEGIN on ``channel`` and wait for the peer's BEGIN answering it."""
        session = SessionState(
            channel=channel,
            next_outgoing_id=next_outgoing_id,
            incoming_window=incoming_window,
            outgoing_window=outgoing_window,
            initial_outgoing_id=next_outgoing_id,
        )
        self.sessions[channel] = session
        self._send(
            channel,
            described(
                "begin",
                next_outgoing_id=uint(next_outgoing_id),
                incoming_window=uint(incoming_window),
                outgoing_window=uint(outgoing_window),
                handle_max=None if handle_max is None else uint(handle_max),
            ),
        )
        self.wait_for("begin", timeout=timeout, where=lambda f: f["remote_channel"] == channel)
        return session

    def attach(
        self,
        name: str,
        role: Role,
        *,
        source: str | None = None,
        target: str | None = None,
        channel: int = 0,
        snd_settle_mode: Literal["unsettled", "settled", "mixed"] | None = None,
        rcv_settle_mode: Literal["first", "second"] | None = None,
        filters: Mapping[str, PythonAMQPData] | None = None,
        properties: Mapping[str, PythonAMQPData] | None = None,
        dynamic: bool = False,
        distribution_mode: Literal["move", "copy"] | None = None,
        initial_delivery_count: int = 0,
        max_message_size: int | None = None,
        capabilities: Sequence[str] = (),
        expiry_policy: str | None = None,
        terminus: Mapping[str, PythonAMQPData] | None = None,
    ) -> int:
        """Send ATTACH and return our handle; ``dynamic`` asks the peer to name our node.

        ``capabilities``, ``expiry_policy`` and the other ``terminus`` fields (by their names
        in §3.5.3 and §3.5.4: ``durable``, ``timeout``, ``outcomes``...) go on our own terminus
        (the source of a receiver, the target of a sender), as Direct Reply-To and temporary
        queues ask. Handles are unique across the client's sessions, so link calls need no
        channel.
        """
        handle = len(self.links)
        self.links[handle] = LinkState(
            handle=handle,
            name=name,
            role=role,
            channel=channel,
            delivery_count=initial_delivery_count if role == "sender" else 0,
        )
        snd_modes = {"unsettled": 0, "settled": 1, "mixed": 2}  # §2.8.2
        rcv_modes = {"first": 0, "second": 1}  # §2.8.3
        ours: dict[str, PythonAMQPData] = {}
        if capabilities:
            # proton types an Array's descriptor as data; UNDESCRIBED is its own sentinel.
            undescribed: Any = UNDESCRIBED
            ours["capabilities"] = Array(undescribed, Data.SYMBOL, *map(symbol, capabilities))
        if expiry_policy is not None:
            ours["expiry_policy"] = symbol(expiry_policy)
        ours.update(terminus or {})
        source_node = described(
            "source",
            address=source,
            dynamic=True if dynamic and role == "receiver" else None,
            distribution_mode=None if distribution_mode is None else symbol(distribution_mode),
            filter=symbol_map(filters),
            **(ours if role == "receiver" else {}),
        )
        target_node = described(
            "target",
            address=target,
            dynamic=True if dynamic and role == "sender" else None,
            **(ours if role == "sender" else {}),
        )
        attach = described(
            "attach",
            name=name,
            handle=uint(handle),
            role=role == "receiver",  # §2.8.1: false is sender, true is receiver
            snd_settle_mode=None if snd_settle_mode is None else ubyte(snd_modes[snd_settle_mode]),
            rcv_settle_mode=None if rcv_settle_mode is None else ubyte(rcv_modes[rcv_settle_mode]),
            source=source_node,
            target=target_node,
            initial_delivery_count=uint(initial_delivery_count) if role == "sender" else None,
            max_message_size=None if max_message_size is None else ulong(max_message_size),
            properties=symbol_map(properties),
        )
        self._send(channel, attach)
        return handle

    def flow(
        self,
        handle: int | None = None,
        *,
        link_credit: int | None = None,
        delivery_count: int | None = None,
        drain: bool = False,
        echo: bool = False,
        available: int | None = None,
        incoming_window: int | None = None,
        channel: int = 0,
        next_incoming_id: int | None = None,
        next_outgoing_id: int | None = None,
        outgoing_window: int | None = None,
    ) -> None:
        """Send FLOW; without a handle it is a session-only FLOW on ``channel``.

        Session fields come from the session's state; ``incoming_window`` also becomes the new
        state (0 closes the window, a later value reopens it) while the other overrides are
        one-off, for protocol-violation tests. Link fields come from the link's state; a given
        ``link_credit`` becomes the link's credit.
        """
        link = None if handle is None else self.links[handle]
        session = self.sessions[channel if link is None else link.channel]
        if incoming_window is not None:
            session.incoming_window = incoming_window
        values: dict[str, PythonAMQPData] = {
            "next_incoming_id": _opt_uint(
                session.next_incoming_id if next_incoming_id is None else next_incoming_id
            ),
            "incoming_window": uint(max(0, session.incoming_window)),
            "next_outgoing_id": uint(
                session.next_outgoing_id if next_outgoing_id is None else next_outgoing_id
            ),
            "outgoing_window": uint(
                session.outgoing_window if outgoing_window is None else outgoing_window
            ),
            "echo": echo or None,
        }
        if link is not None:
            if link_credit is not None:
                link.link_credit = link_credit
            link.drain = drain
            known_count = link.role == "sender" or link.attach_reply is not None
            count = link.delivery_count if known_count else None  # §2.7.4: null before ATTACH
            values |= {
                "handle": uint(link.handle),
                "delivery_count": _opt_uint(count if delivery_count is None else delivery_count),
                "link_credit": uint(max(0, link.link_credit)),
                "available": _opt_uint(available),
                "drain": drain,
            }
        self._send(session.channel, described("flow", **values))

    def send(
        self,
        handle: int,
        payload: bytes,
        *,
        delivery_id: int | None = None,
        tag: bytes | None = None,
        settled: bool = False,
        finish: bool = True,
    ) -> int:
        """Send one message as TRANSFER frames no bigger than the peer's max-frame-size.

        No credit or window check: tests of the server's limits must be able to exceed them.
        Returns the delivery-id; the tag defaults to its decimal digits, unique on the session.
        With ``finish`` false the last frame says more=true too: the delivery stays unfinished
        and :meth:`send_more` continues it.
        """
        link = self.links[handle]
        session = self.sessions[link.channel]
        if delivery_id is None:
            delivery_id = session.next_delivery_id
        session.next_delivery_id = _serial(delivery_id + 1)
        tag = str(delivery_id).encode() if tag is None else tag

        def performative(first: bool, more: bool) -> Described:
            if not first:  # §2.7.5: continuation frames may omit all but handle and more
                return described("transfer", handle=uint(handle), more=more)
            return described(
                "transfer",
                handle=uint(handle),
                delivery_id=uint(delivery_id),
                delivery_tag=tag,
                message_format=uint(MESSAGE_FORMAT),
                settled=settled,
                more=more,
            )

        frames: list[bytes] = []
        offset = 0
        while True:
            # A false `more` encodes to as many bytes as a true one, so the room is exact.
            overhead = FRAME_HEADER.size + len(encode(performative(not frames, True)))
            chunk = payload[offset : offset + self.peer_max_frame_size - overhead]
            offset += len(chunk)
            last = offset >= len(payload)
            more = not last or not finish
            frames.append(encode_frame(session.channel, performative(not frames, more), chunk))
            if last:
                break
        self.send_raw(b"".join(frames))
        session.next_outgoing_id = _serial(session.next_outgoing_id + len(frames))
        session.remote_incoming_window -= len(frames)
        link.delivery_count = _serial(link.delivery_count + 1)
        link.link_credit = max(0, link.link_credit - 1)
        return delivery_id

    def send_more(self, handle: int, payload: bytes, *, finish: bool = False) -> None:
        """Continue an unfinished delivery with ``payload`` in one frame (AMQP 1.0 §2.7.5)."""
        link = self.links[handle]
        session = self.sessions[link.channel]
        performative = described("transfer", handle=uint(handle), more=not finish)
        self.send_raw(encode_frame(session.channel, performative, payload))
        session.next_outgoing_id = _serial(session.next_outgoing_id + 1)
        session.remote_incoming_window -= 1

    def disposition(
        self,
        first: int,
        last: int | None = None,
        *,
        role: Role = "receiver",
        settled: bool = True,
        state: Outcome = "accepted",
        channel: int = 0,
    ) -> None:
        """Send DISPOSITION for deliveries ``first``..``last`` of the session on ``channel``."""
        disposition = described(
            "disposition",
            role=role == "receiver",
            first=uint(first),
            last=_opt_uint(last),
            settled=settled,
            state=_outcome(state),
        )
        self._send(channel, disposition)

    def detach(self, handle: int, *, closed: bool = True, error: AmqpError | None = None) -> None:
        """Send DETACH; ``wait_for("detach")`` reads the peer's answer."""
        link = self.links[handle]
        detach = described(
            "detach",
            handle=uint(handle),
            closed=closed,
            error=None if error is None else error.encode(),
        )
        self._send(link.channel, detach)

    def end(self, channel: int = 0, *, error: AmqpError | None = None) -> None:
        """Send END; ``wait_for("end")`` reads the peer's answer."""
        self._send(channel, described("end", error=None if error is None else error.encode()))

    def close(
        self, *, error: AmqpError | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> Frame | None:
        """Send CLOSE, wait for the peer's CLOSE unless it came first, then drop the socket."""
        try:
            self._send(0, described("close", error=None if error is None else error.encode()))
            if self.peer_close is None:
                self.wait_for("close", timeout=timeout)
            return self.peer_close
        finally:
            self.abort()

    def discard_incoming(self, seconds: float) -> int:
        """Read for ``seconds`` and throw away what arrives, undecoded; return its size.

        A consumer that takes deliveries as fast as the server sends them, however many, at
        no cost to the test. Frames cannot be read afterwards (one may have been cut in two):
        only :meth:`send_raw` and :meth:`abort` make sense then.
        """
        self._buffer.clear()
        deadline = time.monotonic() + seconds
        received = 0
        while (remaining := deadline - time.monotonic()) > 0:
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(RECV_SIZE)
            except TimeoutError:
                break
            if not chunk:
                break
            received += len(chunk)
        return received

    def _heartbeat(self) -> None:
        """Send an empty frame when the peer's idle-time-out (§2.4.5) would otherwise expire."""
        # Half the peer's timeout, as proton does, leaves room for scheduling delays.
        if (
            self.peer_idle_timeout_ms
            and time.monotonic() - self._last_sent >= self.peer_idle_timeout_ms / 2000
        ):
            self.send_raw(HEARTBEAT)

    # ----- reading -----

    def socket_closed(self, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Whether the peer closes the TCP connection within ``timeout`` seconds, whatever it
        sends before (dropped)."""
        deadline = time.monotonic() + timeout
        self._sock.settimeout(timeout)
        try:
            while time.monotonic() < deadline:
                if not self._sock.recv(RECV_SIZE):
                    return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        return False

    def _fill(self, deadline: float) -> bool:
        """Read once, waiting until ``deadline`` at most; False once the socket is done.

        The wait is cut short when a heartbeat falls due, so callers loop until their deadline.
        """
        remaining = max(0.0, deadline - time.monotonic())
        if self.peer_idle_timeout_ms:
            remaining = min(remaining, self.peer_idle_timeout_ms / 2000)
        self._sock.settimeout(remaining)
        try:
            chunk = self._sock.recv(RECV_SIZE)
        # A zero timeout makes the socket non-blocking; TLS says so with SSLWantReadError.
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            return True
        if not chunk:
            if self.peer_close is not None:
                return False  # the peer's CLOSE came first: nothing more is coming
            raise ConnectionClosedError("peer closed the TCP connection without CLOSE")
        self._buffer += chunk
        return True

    def next_frame(self, timeout: float = DEFAULT_TIMEOUT) -> Frame | None:
        """Read the next frame, or None if none arrives within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            frame = parse_frame(self._buffer, self.max_frame_size)
            if frame is not None:
                self._apply(frame)
                self.received.append(frame)
                return frame
            if time.monotonic() >= deadline:
                return None
            self._heartbeat()
            if not self._fill(deadline):
                return None

    def wait_for(
        self,
        performative: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        where: Callable[[Frame], bool] | None = None,
    ) -> Frame:
        """Read until a ``performative`` frame (matching ``where``) arrives; raise on timeout.

        A CLOSE from the peer raises PeerClosedError unless CLOSE is what we wait for.
        """
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next_frame(max(0.0, deadline - time.monotonic()))
            if frame is None:
                seen = [f.performative for f in self.received[-10:]]
                raise TimeoutError(f"no {performative} within {timeout} s; last frames: {seen}")
            if frame.performative == performative and (where is None or where(frame)):
                return frame
            if frame.performative == "close":
                raise PeerClosedError(frame)

    def wait_attach(self, handle: int, timeout: float = DEFAULT_TIMEOUT) -> Attached:
        """Wait for the peer's ATTACH for our link; on a refusal, also for its DETACH."""
        link = self.links[handle]
        deadline = time.monotonic() + timeout
        while link.attach_reply is None:
            self.wait_for("attach", timeout=max(0.0, deadline - time.monotonic()))
        ours = "source" if link.role == "receiver" else "target"
        error = None
        if link.attach_reply[ours] is None:
            while link.detach_frame is None:
                self.wait_for("detach", timeout=max(0.0, deadline - time.monotonic()))
            error = link.detach_frame["error"]
        return Attached(link.attach_reply, error)

    def wait_credit(self, handle: int, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Wait until our sender link has credit, and return it."""
        link = self.links[handle]
        deadline = time.monotonic() + timeout
        while link.link_credit <= 0:
            self.wait_for("flow", timeout=max(0.0, deadline - time.monotonic()))
        return link.link_credit

    def wait_outcomes(
        self, delivery_ids: Iterable[int], *, channel: int = 0, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[int, Composite | None]:
        """Wait until the peer has reported on every delivery in ``delivery_ids``."""
        session = self.sessions[channel]
        wanted = set(delivery_ids)
        deadline = time.monotonic() + timeout
        while not wanted <= session.outcomes.keys():
            self.wait_for("disposition", timeout=max(0.0, deadline - time.monotonic()))
        return {i: session.outcomes[i] for i in sorted(wanted)}

    def next_message(self, timeout: float = DEFAULT_TIMEOUT) -> Delivery | None:
        """Return the next whole message, or None if none completes within ``timeout``.

        Other frames read meanwhile are applied and recorded in ``received`` as usual.
        """
        deadline = time.monotonic() + timeout
        while not self._deliveries:
            frame = self.next_frame(max(0.0, deadline - time.monotonic()))
            if frame is None:
                return None
            if frame.performative == "close":
                raise PeerClosedError(frame)
        return self._deliveries.popleft()

    def expect_nothing(self, seconds: float) -> list[Frame]:
        """Read for ``seconds`` and return what arrived: ``assert not c.expect_nothing(0.2)``."""
        deadline = time.monotonic() + seconds
        frames = []
        while (frame := self.next_frame(max(0.0, deadline - time.monotonic()))) is not None:
            frames.append(frame)
        return frames

    # ----- state -----

    def _link(self, frame: Frame) -> LinkState | None:
        session = self._by_remote_channel.get(frame.channel)
        return None if session is None else session.remote_handles.get(frame["handle"])

    def _apply(self, frame: Frame) -> None:
        """Update our view of the connection with a frame the peer sent (§2.5.6, §2.6.7)."""
        match frame.performative:
            case "open":
                self.peer_open = frame
                peer_max = frame["max_frame_size"]
                # §2.7.1: an absent max-frame-size means the largest uint.
                self.peer_max_frame_size = (1 << 32) - 1 if peer_max is None else peer_max
                self.peer_idle_timeout_ms = frame["idle_time_out"]
            case "begin":
                self._on_begin(frame)
            case "attach":
                self._on_attach(frame)
            case "flow":
                self._on_flow(frame)
            case "transfer":
                self._on_transfer(frame)
            case "disposition":
                self._on_disposition(frame)
            case "detach":
                # The session the frame's channel names, which a BEGIN on a reused channel of
                # ours may have replaced in ``sessions``.
                session = self._by_remote_channel.get(frame.channel)
                link = (
                    None if session is None else session.remote_handles.pop(frame["handle"], None)
                )
                if link is not None:
                    link.detach_frame = frame
            case "end":
                session = self._by_remote_channel.get(frame.channel)
                if session is not None:
                    session.end_frame = frame
            case "close":
                self.peer_close = frame

    def _on_begin(self, frame: Frame) -> None:
        session = self.sessions.get(frame["remote_channel"])
        if session is None:
            return
        session.begin_reply = frame
        session.remote_channel = frame.channel
        self._by_remote_channel[frame.channel] = session
        session.next_incoming_id = frame["next_outgoing_id"]
        session.remote_incoming_window = frame["incoming_window"]
        session.remote_outgoing_window = frame["outgoing_window"]

    def _on_attach(self, frame: Frame) -> None:
        session = self._by_remote_channel.get(frame.channel)
        if session is None:
            return
        # §2.6.1: a name is unique per direction, so a link pair (management's) shares one.
        ours = "sender" if frame["role"] else "receiver"
        for link in self.links.values():
            if link.channel == session.channel and link.name == frame["name"] and link.role == ours:
                link.attach_reply = frame
                link.remote_handle = frame["handle"]
                session.remote_handles[frame["handle"]] = link
                if link.role == "receiver":
                    link.delivery_count = frame["initial_delivery_count"] or 0

    def _on_flow(self, frame: Frame) -> None:
        session = self._by_remote_channel.get(frame.channel)
        if session is None:
            return
        # §2.5.6: remote-incoming-window = next-incoming-id(flow) + incoming-window(flow)
        # - next-outgoing-id(ours). Ids are serial numbers, windows plain counts (up to 2^32-1).
        next_incoming = frame["next_incoming_id"]
        if next_incoming is None:
            next_incoming = session.initial_outgoing_id
        session.remote_incoming_window = frame["incoming_window"] + _serial_diff(
            next_incoming, session.next_outgoing_id
        )
        if session.next_incoming_id is not None:
            session.remote_outgoing_window = frame["outgoing_window"] + _serial_diff(
                frame["next_outgoing_id"], session.next_incoming_id
            )
        link = None if frame["handle"] is None else self._link(frame)
        if link is None:
            return
        link.available = frame["available"]
        link.drain = bool(frame["drain"])
        if link.role == "sender":
            # §2.6.7: credit = delivery-count(rcv) + link-credit(rcv) - delivery-count(snd).
            count = frame["delivery_count"]
            count = link.delivery_count if count is None else count
            link.link_credit = frame["link_credit"] + _serial_diff(count, link.delivery_count)
        else:
            # The sender owns delivery-count; our credit limit (count + credit) stays put.
            advanced = _serial_diff(frame["delivery_count"], link.delivery_count)
            link.delivery_count = frame["delivery_count"]
            link.link_credit = max(0, link.link_credit - advanced)

    def _on_transfer(self, frame: Frame) -> None:
        session = self._by_remote_channel.get(frame.channel)
        if session is None:
            return
        if session.next_incoming_id is not None:
            session.next_incoming_id = _serial(session.next_incoming_id + 1)
        session.incoming_window -= 1
        session.remote_outgoing_window -= 1
        link = self._link(frame)
        if link is None:
            return
        if not link.partial:  # §2.6.7: delivery-count counts deliveries, not frames
            link.delivery_count = _serial(link.delivery_count + 1)
            link.link_credit = max(0, link.link_credit - 1)
        link.partial.append(frame)
        if frame["more"] and not frame["aborted"]:
            return
        frames, link.partial = link.partial, []
        if frame["aborted"]:
            return
        head = frames[0]
        self._deliveries.append(
            Delivery(
                handle=link.handle,
                delivery_id=head["delivery_id"],
                tag=head["delivery_tag"],
                settled=any(f["settled"] for f in frames),
                payload=b"".join(f.payload for f in frames),
                frames=len(frames),
            )
        )

    def _on_disposition(self, frame: Frame) -> None:
        session = self._by_remote_channel.get(frame.channel)
        if session is None or not frame["role"]:
            return  # only a receiver's DISPOSITION reports on deliveries we sent
        first = frame["first"]
        last = first if frame["last"] is None else frame["last"]
        for offset in range(_serial_diff(last, first) + 1):
            session.outcomes[_serial(first + offset)] = frame["state"]


def _opt_uint(value: int | None) -> uint | None:
    return None if value is None else uint(value)
