"""The receiver process: one link, credit in batches, latency read from the raw transfer.

Messages are never decoded: ``pn_link_recv`` copies the encoded bytes into one reused buffer and
the send-time stamp is read at its fixed distance from their end (``payload``). Credit is topped
up once half the window is used, one FLOW per half window instead of one per delivery. Messages
stamped before the run began were left on the queue by an earlier run: they are accepted
(drained) but neither counted nor timed, or they would pass for the slowest messages measured.
"""

from __future__ import annotations

import struct
import time
from array import array
from multiprocessing.connection import Connection as Channel
from typing import Final

from proton import Connection, Link, Receiver

from sluicegate.clients.capi import ffi, lib
from sluicegate.clients.quiver.arrow import Arrow
from sluicegate.clients.quiver.payload import PayloadError, body_headers, check_stamped
from sluicegate.clients.quiver.reports import Ready, ReceiverDone, Report, Scoreboard
from sluicegate.clients.quiver.settings import ArrowConfig

__all__ = ["ReceiverArrow", "main"]

STAMP: Final[struct.Struct] = struct.Struct(">q")
HEADROOM: Final[int] = 1024  # bytes of header, properties and annotations expected before a body


class ReceiverArrow(Arrow):
    """Receives until it has ``config.count`` messages or the parent says stop."""

    def __init__(self, config: ArrowConfig, channel: Channel, board: Scoreboard, slot: int) -> None:
        super().__init__(config, channel, board, slot)
        self.received = 0
        self.stale = 0  # left over from an earlier run: drained, not counted
        self.latencies = array("q")
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.used = 0  # credit spent since the last top-up
        self.top_up_at = max(1, config.credit // 2)
        self.headers = body_headers(config.body_size)
        self.checked = False
        # Room for the body and what a broker may add before it; grown for a larger transfer.
        self.buffer = bytearray(config.body_size + HEADROOM)
        self.cbuffer = ffi.from_buffer(self.buffer)

    def open_link(self, connection: Connection) -> Link:
        """Attach a receiver to the address and grant the first window."""
        session = connection.session()
        session.open()
        link = session.receiver(f"{self.config.name} {connection.container}")
        link.source.address = self.config.address
        if self.config.presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        link.open()
        link.flow(self.initial_credit())
        return link

    def accept_link(self, link: Link) -> bool:
        """Peer to peer: take the sender's link to our address and grant it the window."""
        address = link.remote_target.address
        if not isinstance(link, Receiver) or address is None:
            return False
        link.target.address = address
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.flow(self.initial_credit())
        return True

    def initial_credit(self) -> int:
        """The window, or less if fewer messages are expected."""
        count = self.config.count
        return self.config.credit if count is None else min(self.config.credit, count)

    def link_attached(self, link: Link) -> None:
        """Tell the parent senders may start (peer to peer it was told on listening)."""
        if self.config.listen:
            return
        if link.remote_source.address is None:
            return  # the peer refused the address; its detach says why
        self.channel.send(Ready(self.config.name))

    def grant(self, credit: int) -> None:
        """Issue credit, never beyond the messages this receiver may still take."""
        limit = self.config.count
        if limit is not None:
            credit = min(credit, limit - self.received - lib.pn_link_credit(self.pointer))
        if credit > 0:
            lib.pn_link_flow(self.pointer, credit)

    def work(self) -> None:
        """Take every complete transfer waiting on the link.

        Per transfer: copy it out, read the stamp, accept and settle, top credit up at half.
        """
        link = self.pointer
        current, readable, partial = (
            lib.pn_link_current,
            lib.pn_delivery_readable,
            lib.pn_delivery_partial,
        )
        body_size, not_before, count = (
            self.config.body_size,
            self.config.not_before_ns,
            self.config.count,
        )
        append, now_ns = self.latencies.append, time.time_ns
        delivery = current(link)
        while delivery != ffi.NULL and readable(delivery) and not partial(delivery):
            size = lib.pn_delivery_pending(delivery)
            if size > len(self.buffer):
                self.buffer = bytearray(size)
                self.cbuffer = ffi.from_buffer(self.buffer)
            lib.pn_link_recv(link, self.cbuffer, size)
            lib.pn_link_advance(link)
            now = now_ns()
            if not self.checked and not self.check(bytes(self.buffer[:size])):
                return
            sent_ns: int = STAMP.unpack_from(self.buffer, size - body_size)[0]
            if not lib.pn_delivery_settled(delivery):
                lib.pn_delivery_update(delivery, lib.PN_ACCEPTED)
            lib.pn_delivery_settle(delivery)
            if sent_ns < not_before:
                self.stale += 1
            else:
                if self.first_ns is None:
                    self.first_ns = now
                append(now - sent_ns)
                self.last_ns = now
                self.received += 1
            self.used += 1
            if self.used >= self.top_up_at:
                self.grant(self.used)
                self.used = 0
            if self.received == count:
                self.finish()
                return
            delivery = current(link)

    def check(self, raw: bytes) -> bool:
        """The first message must be one of ours; fail the run if not."""
        try:
            check_stamped(raw, self.headers, self.config.body_size)
        except PayloadError as error:
            self.fail(f"{self.config.address}: {error}")
            return False
        self.checked = True
        return True

    def publish(self) -> None:
        """Received and stale counts and the latest latency to the scoreboard."""
        self.board.counts[self.slot] = self.received
        self.board.settled[self.slot] = self.stale
        if self.latencies:
            self.board.latency_ns[self.slot] = self.latencies[-1]

    def done_report(self) -> Report:
        """Totals and every latency, for the percentiles."""
        return ReceiverDone(
            self.config.name,
            self.received,
            self.stale,
            self.first_ns,
            self.last_ns,
            self.latencies.tobytes(),
            self.cpu_s(),
        )


def main(config: ArrowConfig, channel: Channel, board: Scoreboard, slot: int) -> None:
    """Process entry point: run one receiver until it is done or told to stop."""
    ReceiverArrow(config, channel, board, slot).run()
