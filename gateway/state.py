"""What the gateway keeps per connection, session and link beside proton's own endpoints.

Each record ties a proton endpoint to the pure state machine that decides for it. They are
attached to proton's wrappers as the attribute ``sg``: proton keeps wrapper attributes in a
record on the C object, so every wrapper of the same endpoint sees them.

That record is also how a closed connection would leak: the C object holds the record, the
record holds our state, and our state holds a wrapper, which holds a reference to the C object.
Python's collector cannot see the C edge, so the cycle is never freed, and with it everything
the connection held. :func:`forget` takes the records off every endpoint of a connection once
its transport has closed; from then on only the broker's own maps refer to the state, and they
drop it in ``Connections.release`` (gateway/connections.py).

Cycles among our own records would hold a closed connection too, all its proton objects with it
(its unsettled deliveries: 160 MiB for 200,000), until a full collection, which an idle server
never runs (issue 31). Each is cut where its connection, session or link ends: a session's
links (``Sessions.end``), the links whose ATTACH reply waits (``Links.release``),
a publisher's pure link and the connection's inbound session (``Publishing.detach`` and
``release``), and the selectable's record and gate once proton is done with the socket
(:func:`forget_selectable`). An ended session and a detached link are freed in proton, their
records taken off first (:func:`forget_session`, ``Links.detached``): proton would
keep them, with every delivery they sent, as long as the connection (or the session) lives.
tests/integration/test_connection_leaks.py checks, with the collector off, that nothing of a
closed connection, an ended session or a detached link outlives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from proton import Connection, Endpoint, Receiver, Sender, Session, Transport

from sluicegate.gateway.proton.internals import Selectable
from sluicegate.gateway.proton.payload_buffers import Held
from sluicegate.gateway.proton.window import remote_incoming_window, session_address
from sluicegate.gateway.rules.auth import Permissions, User
from sluicegate.gateway.rules.credit_hold import CreditHold
from sluicegate.gateway.rules.routing import PublishTarget, Router
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.gateway.rules.timeouts import Deadlines
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.account import Account
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.endpoint_memory import EndpointMemory
from sluicegate.session.inbound import Inbound
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.outbound import TRANSFER_FRAME_OVERHEAD, LinkFlow
from sluicegate.session.outbound import Session as PureSession
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.waiting import Waiting
from sluicegate.wire.handover import Recording
from sluicegate.wire.held_frames import HeldFrames
from sluicegate.wire.link_names import LinkNames
from sluicegate.writer.credit import SessionCredit
from sluicegate.writer.writer import Writer

# The attribute under which an endpoint's record is kept (``link.sg``, ``session.sg``, ...).
RECORD: Final = "sg"
# The attribute under which a socket's selectable keeps its gate (gateway/gate.py).
GATE: Final = "gate"


class Arrival(Protocol):
    """A connection another worker is handing over, until this one takes it
    (gateway/handover.py): its socket is neither read nor written meanwhile."""

    def absorb(self, state: ConnectionState, data: bytes) -> None: ...


class InboundCheck(Protocol):
    """What weighs a connection's input before proton decodes it (gateway/disposition_bound.py),
    named here so that the record does not import the check that reads it."""

    def admits(self, state: ConnectionState, data: bytes) -> bool: ...

    def cut(self) -> tuple[int, bytes] | None: ...


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection is: the user it logged in as, the virtual host its OPEN entered and
    what the user may do there. Frozen, so that who a connection is changes only where a
    ConnectionState method replaces it: at login, at OPEN, at a token renewal."""

    user: User | None = None
    vhost: VirtualHost | None = None
    permissions: Permissions | None = None


NOBODY_YET: Final = Principal()


class ConnectionState:
    """One client connection: its writer ledger, its account and its sessions."""

    __slots__ = (
        "__weakref__",
        "account",
        "arrival",
        "attach_bytes",
        "backlog",
        "closed",
        "connection",
        "credit_hold",
        "deadlines",
        "dispositions",
        "endpoint_bytes",
        "endpoints",
        "fresh_links",
        "held",
        "inbound",
        "letters",
        "link_names",
        "name",
        "opened_at",
        "pooled",
        "principal",
        "publishers",
        "recording",
        "selectable",
        "sent",
        "sessions",
        "temporary",
        "transport",
        "unframed",
        "waiting",
        "writer",
    )

    def __init__(
        self,
        connection: Connection,
        transport: Transport,
        selectable: Selectable,
        name: str,
        writer: Writer,
        account: Account,
        waiting: Waiting,
        letters: DeadLetterDebt,
        dispositions: InboundCheck,
        link_names: LinkNames | None,
        endpoints: EndpointMemory,
    ) -> None:
        self.connection = connection
        self.transport = transport
        # RabbitMQ's connection name, "PEER -> LOCAL", by which the HTTP API lists and closes it.
        self.name = name
        self.selectable = selectable
        self.writer = writer
        # Work this connection caused that is not finished; reads pause while it is too high.
        self.account = account
        # What its sessions hold for its consumers and have not sent, within the configured
        # limit and counted in the server's total.
        self.waiting = waiting
        # The dead letters its consumers' outcomes made that are not stored yet: at its limit
        # the links that made them get no new deliveries (session/dead_letter_debt.py).
        self.letters = letters
        self.sessions: dict[SessionCredit, SessionState] = {}
        # Its publishers' links, forgotten with it whether or not they were detached first.
        self.publishers: set[IncomingLinkState] = set()
        # The inbound session, from its first publishing link on (session/inbound.py).
        self.inbound: Inbound | None = None
        # Unsettled deliveries (``pn_delivery_t *``, held, with their buffers) whose payload
        # buffers proton still has to frame before they can be given back
        # (gateway/proton/payload_buffers.py).
        self.unframed: list[Held] = []
        # Unsettled deliveries handed to proton in this reactor pass, not held: the flush that
        # pumped them gives their buffers back or holds them (Sending.give_back_buffers).
        self.sent: list[object] = []
        # The most that one of its ended sessions released of unsettled deliveries (counted as
        # the memory budget counts them): proton pools the deliveries' structs for reuse until
        # the connection goes, then frees them (gateway/proton/heap_trim.py trims after that).
        self.pooled = 0
        self.closed = False
        # Who it is; replaced whole, and only by the three methods below.
        self.principal = NOBODY_YET
        # time.monotonic() when its OPEN entered the vhost (the HTTP API lists it from then on,
        # gateway/http/api_connections.py).
        self.opened_at = 0.0
        # Its handshake, idle and credential deadlines (gateway/rules/timeouts.py).
        self.deadlines = Deadlines()
        # RabbitMQ's repeated link names, made unique between the socket and proton
        # (gateway/feeding.py); None when the server is not RabbitMQ-compatible.
        self.link_names = link_names
        # Its DISPOSITIONs weighed before proton copies their outcomes (gateway/feeding.py).
        self.dispositions = dispositions
        # Bytes for proton that it had no room for yet (gateway/feeding.py).
        self.backlog = bytearray()
        # What it sent while held unread, read ahead for the frames that free things
        # (wire/held_frames.py, gateway/proton/io_layer.py).
        self.held = HeldFrames()
        # Temporary queues its links' dynamic termini made, by the link (a consumer's pure
        # link, a publisher's state): deleted when that link detaches or the connection closes
        # (gateway/dynamic.py).
        self.temporary: dict[object, tuple[QueueRegistry, str]] = {}
        # What its live sessions' links' ATTACH data costs (gateway/limits.py).
        self.attach_bytes = 0
        # The server's account of what connections, sessions and links hold, and what this
        # connection holds in it: itself, its live sessions and their links (gateway/limits.py).
        self.endpoints = endpoints
        self.endpoint_bytes = 0
        # Consumer links whose ATTACH reply the socket has not taken yet: their credit waits
        # for it (gateway/links.py, Links.attaches_written).
        self.fresh_links: list[OutgoingLinkState] = []
        # Then, those the client had granted credit: it waits for the client's next frame
        # (gateway/rules/credit_hold.py).
        self.credit_hold: CreditHold[OutgoingLinkState] = CreditHold()
        # Until its first ATTACH, a plain connection's bytes, for handing it to the worker of
        # the queue the ATTACH names (wire/handover.py, gateway/handover.py); None once decided.
        self.recording: Recording | None = None
        # On the worker taking it over: what its server must write before it takes it.
        self.arrival: Arrival | None = None

    @property
    def user(self) -> User | None:
        """Who logged in (gateway/sasl.py); None until the SASL exchange is done."""
        return self.principal.user

    @property
    def vhost(self) -> VirtualHost | None:
        """The virtual host its OPEN entered; None before."""
        return self.principal.vhost

    @property
    def permissions(self) -> Permissions | None:
        """What its user may do in its virtual host; None before its OPEN entered one."""
        return self.principal.permissions

    def logged_in(self, user: User) -> None:
        """The SASL exchange named its user (gateway/gate.py), before proton sees an OPEN."""
        self.principal = Principal(user)

    def entered(self, vhost: VirtualHost, permissions: Permissions) -> None:
        """Its OPEN let it into ``vhost`` (gateway/connections.py)."""
        self.principal = Principal(self.principal.user, vhost, permissions)

    def renewed(self, user: User, permissions: Permissions) -> None:
        """A renewed token (gateway/renewal.py) names the same user, with what it now grants."""
        self.principal = Principal(user, self.principal.vhost, permissions)

    @property
    def reads_paused(self) -> bool:
        """The socket must not be read: the account is too deep or the memory budget holds it."""
        inbound = self.inbound
        return self.account.paused or (inbound is not None and inbound.budget_paused)


class SessionState:
    """One AMQP session: the pure outbound session and the proton session it drives."""

    __slots__ = (
        "__weakref__",
        "address",
        "attach_bytes",
        "connection",
        "endpoint_bytes",
        "links",
        "pure",
        "senders",
        "session",
    )

    def __init__(self, connection: ConnectionState, session: Session, pure: PureSession) -> None:
        self.connection = connection
        self.session = session
        self.pure = pure
        self.address = session_address(session)
        self.senders: dict[OutgoingLink, OutgoingLinkState] = {}
        # Links the client attached and has not detached, refused ones included
        # (gateway/limits.py): the per-session limit is checked against this count.
        self.links = 0
        # What those links' ATTACH data costs, part of the connection's ``attach_bytes``.
        self.attach_bytes = 0
        # What it and those links hold, part of the connection's ``endpoint_bytes``.
        self.endpoint_bytes = 0

    @property
    def live(self) -> bool:
        """Whether the session has not ended (an END either way, or the connection's end)."""
        return self.pure.writer_credit in self.connection.sessions

    def refresh_window(self) -> None:
        """Read the client's remote incoming window, less what proton still holds to send.

        Proton subtracts frames only once it writes them, so bytes it holds unsent would be
        counted twice; they are converted to frames and taken off.
        """
        held = self.session.outgoing_bytes
        frames_held = -(-held // (self.pure.frame_payload + TRANSFER_FRAME_OVERHEAD))
        self.pure.remote_incoming_window = remote_incoming_window(self.address) - frames_held


class IncomingLinkState:
    """A publisher's link: where its messages go, its credit, and the account it charges.

    Its pure link is attached to the connection's inbound session as the record is made, with
    the record as its owner: the two refer to each other from the start (``Publishing.detach``
    cuts the pure link's side).
    """

    __slots__ = (
        "__weakref__",
        "connection",
        "link",
        "partial",
        "queues",
        "receiver",
        "released",
        "router",
        "target",
    )

    def __init__(
        self,
        receiver: Receiver,
        target: PublishTarget,
        inbound: Inbound,
        connection: ConnectionState,
        router: Router,
    ) -> None:
        self.receiver = receiver
        self.target = target
        # Its credit: the first FLOW's is ``link.credit`` (0 while the budget is exhausted).
        self.link: IncomingLink = inbound.attach(self)
        self.connection = connection
        # Routes through the queues and exchanges of the connection's virtual host.
        self.router = router
        # The bytes of the delivery still arriving, drained from proton frame by frame.
        self.partial: bytearray | None = None
        # The queues its last message went to: what the memory budget weighs it by.
        self.queues: list[QueueType] = []


@dataclass(slots=True, weakref_slot=True)
class OutgoingLinkState:
    """A consumer's link: proton's sender and the pure link that decides for it."""

    sender: Sender
    link: OutgoingLink
    session: SessionState
    # A drain completed in the session whose FLOW proton must send after its queued transfers.
    drain_pending: LinkFlow | None = None
    # Whether the client's credit counts: not before the socket has taken the ATTACH reply,
    # nor, for credit granted before that, while it is held (gateway/rules/credit_hold.py).
    credit_counts: bool = False
    # The queue's owner, another worker, has not taken the consumer yet: the ATTACH reply waits
    # for it, so that a refusal there refuses the ATTACH (docs/workers.md).
    owner_pending: bool = False


def forget(state: ConnectionState) -> None:
    """Take the records off a finished connection and all its sessions and links.

    Called once its transport has closed: no frame can arrive for its endpoints any more, and
    handlers of the events still queued for them find no record and do nothing.
    """
    connection = state.connection
    endpoints: list[Endpoint] = [connection]
    session = connection.session_head(0)
    while session is not None:
        endpoints.append(session)
        session = session.next(0)  # type: ignore[no-untyped-call]
    link = connection.link_head(0)
    while link is not None:
        endpoints.append(link)
        link = link.next(0)
    for endpoint in endpoints:
        forget_endpoint(endpoint)


def forget_session(session: Session) -> None:
    """Take the records off an ended session and its links, before proton frees them."""
    forget_endpoint(session)
    link = session.connection.link_head(0)
    while link is not None:
        if link.session == session:
            forget_endpoint(link)
        link = link.next(0)


def forget_selectable(selectable: Selectable) -> None:
    """Take the connection's record and gate off a socket's selectable proton is done with.

    Both point back at the selectable through the connection's record: left, the three would
    hold the connection and its proton objects until a full collection.
    """
    for name in (RECORD, GATE):
        if hasattr(selectable, name):
            delattr(selectable, name)


def forget_endpoint(endpoint: Endpoint) -> None:
    """Take the record off one endpoint: events still to come for it find none."""
    if hasattr(endpoint, RECORD):
        delattr(endpoint, RECORD)
