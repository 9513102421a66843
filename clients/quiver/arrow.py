"""What a sender and a receiver process share: the loop, connecting or listening, the endings.

Each process runs one ``Pump`` (a connection without proton's reactor, ``clients/pump.py``) in
a loop: move bytes, let the subclass do its work on the link, look at what the peer did, and ten
times a second publish counters and listen to the parent. Peer to peer the receiver listens and
opens whatever the sender opened, which proton's messaging handler would otherwise do.
"""

from __future__ import annotations

import math
import os
import select
import socket
import time
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection as Channel
from typing import Any, Final

from proton import Condition, Connection, Endpoint, Link

from sluicegate.clients.capi import link_pointer
from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver.reports import STOP, Failed, Ready, Report, Scoreboard
from sluicegate.clients.quiver.settings import ArrowConfig

__all__ = ["TICK_S", "Arrow", "describe"]

TICK_S: Final[float] = 0.1  # counters published, stop and parent polled: 10 Hz costs nothing
LISTEN_BACKLOG: Final[int] = 16  # peer to peer, one sender connects to each receiver


def describe(condition: Condition | None, default: str) -> str:
    """One line from an AMQP error condition: its description and name, else ``default``."""
    if condition is None:
        return default
    if condition.description:
        return f"{condition.description} ({condition.name})"
    return str(condition.name)


class Arrow(ABC):
    """One sender or receiver: a connection, one link on it, counters, and how it ends.

    Subclasses open their link (``open_link``) or take the peer's (``accept_link``), act once it
    is attached (``link_attached``), do their work each turn (``work``) and say what to report
    (``done_report``). A clean close by the peer ends a listening receiver only when the parent
    says so; anything else that ends the connection early is a failure.
    """

    def __init__(self, config: ArrowConfig, channel: Channel, board: Scoreboard, slot: int) -> None:
        self.config = config
        self.channel = channel
        self.board = board
        self.slot = slot
        self.parent_pid = os.getppid()
        self.engine: Pump | None = None
        self.listener: socket.socket | None = None
        self.link: Link | None = None
        self.pointer: Any = None  # the link's pn_link_t *, for the per-message calls
        self.attached = False
        self.finished = False
        self.next_tick = 0.0
        self.cpu_start_s = time.process_time()  # after the imports: the run's cost only

    # -- what subclasses fill in

    @abstractmethod
    def open_link(self, connection: Connection) -> Link:
        """Create and open this arrow's link on a connection it opened."""

    @abstractmethod
    def accept_link(self, link: Link) -> bool:
        """Set up a link the peer opened (listening); False if this arrow does not want it."""

    @abstractmethod
    def link_attached(self, link: Link) -> None:
        """The link is open at both ends."""

    @abstractmethod
    def work(self) -> None:
        """Send or receive what the link allows now."""

    @abstractmethod
    def publish(self) -> None:
        """Copy the counters to the scoreboard."""

    def cpu_s(self) -> float:
        """CPU time used since the arrow was made, for its done report."""
        return time.process_time() - self.cpu_start_s

    @abstractmethod
    def done_report(self) -> Report:
        """The totals to send when the run ends."""

    def busy(self) -> bool:
        """True while there is work to do without waiting for the peer (do not sleep)."""
        return False

    def due(self) -> float:
        """The next monotonic time the arrow must act by itself (``inf``: none)."""
        return math.inf

    # -- the loop

    def run(self) -> None:
        """Connect or listen, then turn until done; close cleanly on the way out."""
        try:
            self.start()
            while not self.finished:
                self.turn()
        except KeyboardInterrupt:
            self.finished = True
        except (EOFError, BrokenPipeError):
            # The parent closed its end of the channel: it ended the run (a timeout, a failure
            # elsewhere) and reads no report, so this process ends quietly, not with a traceback.
            self.finished = True
        finally:
            self.shutdown()

    def start(self) -> None:
        """Open the connection and the link, or listen for the peer's."""
        config = self.config
        try:
            if config.listen:
                self.listener = socket.create_server(
                    (config.host, config.port), backlog=LISTEN_BACKLOG
                )
            else:
                self.engine = Pump.connect(config.host, config.port, config.name, config.timeout)
        except OSError as error:
            verb = "listen on" if config.listen else "connect to"
            self.fail(f"cannot {verb} {config.host_port}: {error.strerror or error}")
            return
        if self.engine is None:
            self.channel.send(Ready(config.name))
            return
        self.engine.connection.open()
        self.link = self.open_link(self.engine.connection)
        self.pointer = link_pointer(self.link)

    def turn(self) -> None:
        """One pass: timers, bytes in and out, the subclass's work, the peer's moves."""
        now = time.monotonic()
        if now >= self.next_tick:
            self.next_tick = now + TICK_S
            self.tick()
            if self.finished:
                return
        timeout = 0.0 if self.busy() else min(self.next_tick, self.due()) - now
        engine = self.engine
        if engine is None:
            self.wait_for_peer(timeout)
            return
        engine.pump(timeout)
        if self.config.listen:
            self.answer_peer(engine.connection)
        if self.pointer is not None:
            self.work()
        self.watch(engine)

    def tick(self) -> None:
        """Publish counters, take the parent's stop, and end if the parent is gone."""
        self.publish()
        if os.getppid() != self.parent_pid:
            self.finished = True
            return
        while not self.finished and self.channel.poll():
            if self.channel.recv() == STOP:
                self.finish()

    def wait_for_peer(self, timeout: float) -> None:
        """Listening: take the first connection; after it ended, only wait for the parent."""
        listener = self.listener
        if listener is None:
            time.sleep(max(0.0, timeout))
            return
        ready, _, _ = select.select([listener], [], [], max(0.0, timeout))
        if ready:
            self.engine = Pump.server(listener.accept()[0], self.config.name)
            listener.close()
            self.listener = None

    def answer_peer(self, connection: Connection) -> None:
        """Listening: open the connection, sessions and link the peer opened."""
        if connection.state & Endpoint.LOCAL_UNINIT and connection.state & Endpoint.REMOTE_ACTIVE:
            connection.open()
        # Opening or closing an endpoint takes it off the LOCAL_UNINIT list: take the head again.
        session = connection.session_head(Endpoint.LOCAL_UNINIT)
        while session is not None:
            session.open()
            session = connection.session_head(Endpoint.LOCAL_UNINIT)
        link = connection.link_head(Endpoint.LOCAL_UNINIT)
        while link is not None:
            if self.link is None and self.accept_link(link):
                link.open()
                self.link = link
                self.pointer = link_pointer(link)
            else:
                link.close()
            link = connection.link_head(Endpoint.LOCAL_UNINIT)

    def watch(self, engine: Pump) -> None:
        """Notice the attach, and anything the peer or the socket ended."""
        link = self.link
        if link is not None and not self.attached and link.state & Endpoint.REMOTE_ACTIVE:
            self.attached = True
            self.link_attached(link)
        if link is not None and link.state & Endpoint.REMOTE_CLOSED:
            self.ended_by_peer(link.remote_condition, "link detached by the peer")
        connection = engine.connection
        if connection.state & Endpoint.REMOTE_CLOSED:
            self.ended_by_peer(connection.remote_condition, "connection closed by the peer")
        if engine.closed or engine.eof:
            condition = engine.transport.condition
            lost = f"connection to {self.config.host_port} lost"
            if engine.error is not None:
                lost = f"connection to {self.config.host_port} failed: {engine.error}"
            self.ended_by_peer(condition, lost)

    def ended_by_peer(self, condition: Condition | None, default: str) -> None:
        """Fail unless done; listening, a clean end is the sender being done first."""
        if self.finished:
            return
        if self.config.listen and condition is None:
            self.drop_connection()
            return
        self.fail(describe(condition, default))

    # -- endings

    def finish(self) -> None:
        """Report the totals and close."""
        if self.finished:
            return
        self.publish()
        self.channel.send(self.done_report())
        self.finished = True

    def fail(self, reason: str) -> None:
        """Report one line and close; the parent stops the other processes."""
        if self.finished:
            return
        self.channel.send(Failed(self.config.name, reason))
        self.finished = True

    def drop_connection(self) -> None:
        """Close our end of a connection the peer ended, and forget it."""
        engine = self.engine
        if engine is not None:
            self.close_connection(engine)
            engine.close()
        self.engine = None
        self.link = None
        self.pointer = None

    def shutdown(self) -> None:
        """Close the connection (and the listener), giving the peer a moment to answer."""
        if self.listener is not None:
            self.listener.close()
        if self.engine is not None:
            self.close_connection(self.engine)
            self.engine.close()

    def close_connection(self, engine: Pump) -> None:
        """Send our close and move bytes until the peer has answered.

        Messages sent presettled may still be queued in proton: while the socket keeps taking
        bytes the wait goes on, and it ends after ``timeout`` seconds without any.
        """
        connection = engine.connection
        if not connection.state & Endpoint.LOCAL_CLOSED:
            connection.close()
        written, deadline = engine.written, time.monotonic() + self.config.timeout
        while not engine.closed and not engine.eof and time.monotonic() < deadline:
            engine.pump(TICK_S)
            if connection.state & Endpoint.REMOTE_CLOSED:
                engine.flush()
                return
            if engine.written != written:
                written, deadline = engine.written, time.monotonic() + self.config.timeout
