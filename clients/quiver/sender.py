"""The sender process: one connection, one link, as many messages as credit allows.

Each message is the pre-encoded template with the send time patched into its first body bytes,
handed to proton as ``pn_delivery(tag); pn_link_send(buf); pn_link_advance()`` (``Sender``'s
``delivery``, ``stream`` and ``advance`` without their wrappers, see ``capi``) in a loop over the
credit: per message, three C calls, two ``pack_into`` and no encoding.
"""

from __future__ import annotations

import math
import struct
import time
from collections import deque
from multiprocessing.connection import Connection as Channel
from typing import Any, Final

from proton import Connection, Link

from sluicegate.clients.capi import ffi, lib
from sluicegate.clients.quiver.arrow import Arrow
from sluicegate.clients.quiver.payload import encode_template
from sluicegate.clients.quiver.reports import Report, Scoreboard, SenderDone
from sluicegate.clients.quiver.settings import ArrowConfig

__all__ = ["SenderArrow", "main"]

# Messages handed to proton per turn: a few socket writes' worth (~140 B each on the wire), so a
# huge credit grant is worked off between reads (outcomes, credit) instead of in one long loop.
BATCH: Final[int] = 1000
STAMP: Final[struct.Struct] = struct.Struct(">q")
TAG: Final[struct.Struct] = struct.Struct(">Q")  # delivery tags: a counter, unique per link
# Terminal outcomes (AMQP 1.0 §3.4); "received" is not one.
OUTCOMES: Final[frozenset[int]] = frozenset(
    {lib.PN_ACCEPTED, lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED}
)


class SenderArrow(Arrow):
    """Sends ``config.count`` messages, or sends until ``config.duration`` has passed."""

    def __init__(self, config: ArrowConfig, channel: Channel, board: Scoreboard, slot: int) -> None:
        super().__init__(config, channel, board, slot)
        template = encode_template(config.body_size, config.durable)
        self.buffer = bytearray(template.encoded)
        self.cbuffer = ffi.from_buffer(self.buffer)  # C's view of the same bytes, made once
        self.offset = template.stamp_offset
        self.tag_buffer = bytearray(TAG.size)
        self.ctag = ffi.from_buffer(self.tag_buffer)
        self.unsettled: deque[Any] = deque()  # pn_delivery_t * awaiting an outcome, in send order
        self.sent = 0
        self.settled = 0
        self.accepted = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.deadline = math.inf  # monotonic end of a --duration run, from the attach
        self.stopping = False  # the duration is over: send no more

    def open_link(self, connection: Connection) -> Link:
        """Attach a sender to the address, settled or not as asked."""
        session = connection.session()
        session.open()
        link = session.sender(f"{self.config.name} {connection.container}")
        link.target.address = self.config.address
        link.snd_settle_mode = Link.SND_SETTLED if self.config.presettled else Link.SND_UNSETTLED
        link.open()
        return link

    def accept_link(self, link: Link) -> bool:
        """Senders connect; they never take a link the peer opens."""
        return False

    def link_attached(self, link: Link) -> None:
        """Start the duration from the attach, so start-up does not eat into it."""
        if self.config.duration is not None:
            self.deadline = time.monotonic() + self.config.duration

    def more(self) -> bool:
        """Messages are still to be sent."""
        count = self.config.count
        return not self.stopping and (count is None or self.sent < count)

    def busy(self) -> bool:
        """Credit and messages in hand, and the socket keeps up: no reason to sleep."""
        engine = self.engine
        return (
            self.more()
            and self.attached
            and engine is not None
            and not engine.blocked
            and lib.pn_link_credit(self.pointer) > 0
        )

    def due(self) -> float:
        """The end of the duration."""
        return self.deadline

    def work(self) -> None:
        """Take outcomes, then send; stop at the deadline; finish when all is settled."""
        self.take_outcomes()
        if time.monotonic() >= self.deadline:
            self.stopping = True
        engine = self.engine
        if self.attached and self.more() and engine is not None and not engine.blocked:
            self.send_batch()
        if not self.more() and (self.config.presettled or not self.unsettled):
            self.finish()

    def send_batch(self) -> None:
        """Send while credit lasts, up to ``BATCH``."""
        link = self.pointer
        count = self.config.count
        n = min(lib.pn_link_credit(link), BATCH, BATCH if count is None else count - self.sent)
        if n <= 0:
            return
        buffer, cbuffer, size, offset = self.buffer, self.cbuffer, len(self.buffer), self.offset
        tag_buffer, tag_view = self.tag_buffer, (TAG.size, self.ctag)
        stamp, pack_tag, now = STAMP.pack_into, TAG.pack_into, time.time_ns
        deliver, send, advance, settle = (
            lib.pn_delivery,
            lib.pn_link_send,
            lib.pn_link_advance,
            lib.pn_delivery_settle,
        )
        keep = None if self.config.presettled else self.unsettled.append
        tag = self.sent
        if self.first_ns is None:
            self.first_ns = now()
        for _ in range(n):
            tag += 1
            pack_tag(tag_buffer, 0, tag)
            stamp(buffer, offset, now())
            delivery = deliver(link, tag_view)
            send(link, cbuffer, size)
            advance(link)
            if keep is None:
                settle(delivery)
            else:
                keep(delivery)
        self.sent = tag
        self.last_ns = now()

    def take_outcomes(self) -> None:
        """Count and settle, oldest first, every delivery whose outcome has come back."""
        unsettled = self.unsettled
        remote_state, settle = lib.pn_delivery_remote_state, lib.pn_delivery_settle
        while unsettled:
            outcome = remote_state(unsettled[0])
            if outcome not in OUTCOMES:
                break
            settle(unsettled.popleft())
            self.settled += 1
            if outcome == lib.PN_ACCEPTED:
                self.accepted += 1

    def publish(self) -> None:
        """Sent and settled counts to the scoreboard."""
        self.board.counts[self.slot] = self.sent
        self.board.settled[self.slot] = self.settled

    def done_report(self) -> Report:
        """What was sent, and how much of it the peer accepted."""
        return SenderDone(
            self.config.name, self.sent, self.accepted, self.first_ns, self.last_ns, self.cpu_s()
        )


def main(config: ArrowConfig, channel: Channel, board: Scoreboard, slot: int) -> None:
    """Process entry point: run one sender until it is done."""
    SenderArrow(config, channel, board, slot).run()
