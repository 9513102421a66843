"""A channel between two workers in the reactor: its socket polled as a client's is.

Proton's reactor knows only its own selectables, so the socket joins it as one without a
transport (``register``), its events coming here. A frame's pieces go out with one ``sendmsg``
(a delivery's payload is the queue's own bytes object, never joined into a copy); reads go
straight into the :class:`~session.channel.codec.FrameReader`'s buffer. Reads stop while the
worker's memory budget holds its publishers, as a client's do (docs/workers.md), and what waits
to be written is bounded by the protocol itself: deliveries by the credit granted, publishes by
the publishers' credit, renewed only once confirmed.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Final

from proton import Event
from proton.reactor import Container

from sluicegate.gateway.proton.internals import Selectable, register
from sluicegate.session.channel.codec import ChannelError, FrameReader
from sluicegate.session.channel.frames import Frame

log = logging.getLogger("sluicegate.channel")

# Bytes read per readiness, as for a client (gateway/proton/io_layer.py's READ_BATCH): one
# busy channel does not starve the clients.
READ_BATCH: Final = 256 * 1024
# Bytes per read into the frame buffer: a batch of 256 deliveries of 100-byte messages.
READ_CHUNK: Final = 64 * 1024
# Pieces per sendmsg: Linux's IOV_MAX.
IOV_MAX: Final = 1024
# Bytes written per flush or writability, as for a client (gateway/proton/io_layer.py's
# WRITE_BATCH), larger since a channel carries many clients' traffic: about a millisecond of
# writing. Unbounded, a flush wrote for as long as the other worker read: a fan-out's copies
# share one payload here but cross once per queue, and seed 66073 spent 2 s in one flush while
# every client of this worker waited (docs/adversary.md).
WRITE_BATCH: Final = 1024 * 1024


class ChannelSocket:
    """One end of a channel's socket pair, read and written by the reactor."""

    def __init__(
        self,
        container: Container,
        sock: socket.socket,
        reader: FrameReader,
        receive: Callable[[list[Frame]], None],
        ended: Callable[[str], None],
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.reader = reader
        self._receive = receive
        self._ended = ended
        self.output: deque[bytes | memoryview] = deque()
        self.closed = False
        # Ended because the peer broke the protocol (a malformed or unexpected frame).
        self.broken = False
        # Its readiness comes straight from the reactor's IO handler, not as proton's events:
        # an event's wrapping and two dispatches were a pass's cost again for every frame
        # batch read or written (docs/workers.md).
        self.selectable: Selectable = register(container, sock, self, direct=True)

    def send(self, pieces: list[bytes]) -> None:
        """Queue a frame's pieces; :meth:`flush` writes them."""
        if not self.closed:
            # An empty piece (an empty table, an empty payload) would make a sendmsg of only
            # such pieces write nothing, and look like a full socket.
            self.output.extend(filter(None, pieces))

    def flush(self) -> None:
        """Write what the socket takes now, up to :data:`WRITE_BATCH`; wait for writability
        for the rest."""
        output = self.output
        sock = self.sock
        left = WRITE_BATCH
        while output and left > 0 and not self.closed:
            whole = len(output) <= IOV_MAX
            batch = list(output) if whole else list(islice(output, IOV_MAX))
            try:
                written = sock.sendmsg(batch)
            except BlockingIOError:
                break
            except OSError as error:
                self.end(f"send failed: {error}")
                return
            if whole and written == sum(map(len, batch)):
                # All of it, as almost always: no walk over a frame's pieces.
                output.clear()
                break
            left -= written
            while written:
                head = output[0]
                if len(head) <= written:
                    written -= len(head)
                    output.popleft()
                else:
                    output[0] = memoryview(head)[written:]
                    written = 0
        wanted = bool(output) and not self.closed
        if wanted != self.selectable.writing and not self.closed:
            self.selectable.writing = wanted
            self.selectable.update()

    def on_selectable_readable(self, event: Event) -> None:
        self.readable()

    def readable(self) -> None:
        """Read up to :data:`READ_BATCH` into the frame buffer and hand the frames on. Always
        read: the channel carries the other worker's consumers' credit and settlements, which
        drain this worker's queues, beside its publishes, which gateway/peers.py parks while
        the budget is blocked."""
        left = READ_BATCH
        reader = self.reader
        recv_into = self.sock.recv_into
        while left > 0 and not self.closed:
            try:
                count, frames = reader.fill(recv_into, READ_CHUNK)
            except BlockingIOError:
                break
            except ChannelError as error:
                self.end(f"the peer broke the channel protocol: {error}", broken=True)
                return
            except OSError as error:
                self.end(f"recv failed: {error}")
                return
            if frames:
                self._receive(frames)
            if count == 0:
                self.end("the peer worker ended")
                return
            if count < READ_CHUNK:
                # The socket held less than a read takes: it is empty now, and the selector,
                # level-triggered, reports whatever comes next. Reading on until it says so
                # cost a recv and an exception per readiness on both workers.
                break
            left -= count

    def on_selectable_writable(self, event: Event) -> None:
        self.flush()

    def writable(self) -> None:
        self.flush()

    def end(self, reason: str, *, broken: bool = False) -> None:
        """Close the socket (its peer is gone or, ``broken``, broke the protocol) and say so
        once."""
        if self.closed:
            return
        self.closed = True
        self.broken = broken
        self.output.clear()
        self.selectable.terminate()
        self.selectable.update()
        log.info("channel ended: %s", reason)
        self._ended(reason)

    def close(self) -> None:
        """The worker stops: the reactor lets go of the socket, nothing is said."""
        if not self.closed:
            self.closed = True
            self.selectable.terminate()
            self.selectable.update()
