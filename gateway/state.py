"""What the gateway keeps per connection, session and link beside proton's own endpoints.

Each record ties a proton endpoint to the pure state machine that decides for it. They are
attached to proton's wrappers as the attribute ``sg`` (proton keeps wrapper attributes in a
record on the C object, so every wrapper of the same endpoint sees them).
"""

from __future__ import annotations

from dataclasses import dataclass

from proton import Connection, Receiver, Sender, Session, Transport
from proton._selectable import Selectable

from sluicegate.gateway.auth import User
from sluicegate.gateway.routing import PublishTarget
from sluicegate.gateway.window import remote_incoming_window, session_address
from sluicegate.session.account import Account
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.session import TRANSFER_FRAME_OVERHEAD
from sluicegate.session.session import Session as PureSession
from sluicegate.writer.credit import SessionCredit
from sluicegate.writer.writer import Writer


class ConnectionState:
    """One client connection: its writer ledger, its account and its sessions."""

    __slots__ = (
        "account",
        "closed",
        "connection",
        "idle_timeout",
        "selectable",
        "sessions",
        "transport",
        "user",
        "writer",
    )

    def __init__(
        self,
        connection: Connection,
        transport: Transport,
        selectable: Selectable,
        writer: Writer,
        account: Account,
    ) -> None:
        self.connection = connection
        self.transport = transport
        self.selectable = selectable
        self.writer = writer
        # Work this connection caused that is not finished; reads pause while it is too high.
        self.account = account
        self.sessions: dict[SessionCredit, SessionState] = {}
        self.closed = False
        # Who logged in (gateway/sasl.py); None until the SASL exchange is done.
        self.user: User | None = None
        # The idle timeout (s) suspended while reads are paused (gateway/reading.py); 0: none.
        self.idle_timeout = 0.0


class SessionState:
    """One AMQP session: the pure outbound session and the proton session it drives."""

    __slots__ = ("address", "connection", "pure", "senders", "session")

    def __init__(self, connection: ConnectionState, session: Session, pure: PureSession) -> None:
        self.connection = connection
        self.session = session
        self.pure = pure
        self.address = session_address(session)
        self.senders: dict[OutgoingLink, OutgoingLinkState] = {}

    def refresh_window(self) -> None:
        """Read the client's remote incoming window, less what proton still holds to send.

        Proton subtracts frames only once it writes them, so bytes it holds unsent would be
        counted twice; they are converted to frames and taken off.
        """
        held = self.session.outgoing_bytes
        frames_held = -(-held // (self.pure.frame_payload + TRANSFER_FRAME_OVERHEAD))
        self.pure.remote_incoming_window = remote_incoming_window(self.address) - frames_held


@dataclass(slots=True, eq=False)
class IncomingLinkState:
    """A publisher's link: where its messages go, its credit, and the account it charges."""

    receiver: Receiver
    target: PublishTarget
    link: IncomingLink
    connection: ConnectionState


@dataclass(slots=True)
class OutgoingLinkState:
    """A consumer's link: the pure link and proton's credit limit last seen on it."""

    sender: Sender
    link: OutgoingLink
    session: SessionState
    # Proton's delivery-count on this link: deliveries advanced plus credit drained.
    delivery_count: int = 0
    # The credit limit (delivery-count + credit) and drain flag of the last client FLOW seen.
    limit: int = 0
    drain: bool = False
    # A drain completed in the session whose FLOW proton must send after its queued transfers.
    drain_pending: bool = False
