"""The driver-side receiver of ``mode=queue``: one link, a large credit window, nothing settled
until Spark says the micro-batch is committed.

Spark calls the streaming runner only when it plans or commits a batch, and a batch may take
long; so a daemon thread keeps pumping the connection (receiving into the buffer, answering
heartbeats, sending settlements) while Spark works. One lock guards every proton object: proton
is not thread-safe. Credit is the window minus what the connector holds (buffered, or handed to
Spark and not yet accepted), so however slow Spark is, it never holds more than ``credit``
messages, and the gateway's own flow control bounds what is in flight on the socket.

Closing settles what the connector holds so that a redelivery means what it says: first the
link's credit goes to zero (a FLOW with link-credit 0, which the gateway honours), then the
messages that arrived but were never handed to Spark are ``released`` (AMQP 1.0 §3.4.4: the
gateway puts them back unchanged, delivery-count not raised), and those handed to a batch Spark
had not committed are ``modified`` with delivery-failed (delivery-count raised: a sink may have
written them). Only a connection that dies leaves the choice to the gateway, which then counts
every unsettled delivery as possibly delivered.
"""

from __future__ import annotations

import threading
import time
import uuid
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final

from proton import Receiver

from sluicegate.clients.capi import lib, link_pointer, receive_transfers, unused_credit
from sluicegate.spark.amqp import POLL_S, AmqpConnection, AmqpError
from sluicegate.spark.options import Endpoint

# How long a stopping receiver waits for its thread and for the gateway's CLOSE.
CLOSE_TIMEOUT_S: Final = 5.0
# After the credit-0 FLOW, messages the gateway sent before it saw it still arrive: the close
# waits until none has come for this long (loopback and LAN round trips are far shorter)...
IN_FLIGHT_QUIET_S: Final = 0.2
# ...and no longer than this in all.
IN_FLIGHT_MAX_S: Final = 2.0
# Transfers taken from proton per pass of the pump thread: a bound on the time the lock is held.
TAKE_PER_PASS: Final = 10_000


def batch_head(
    sizes: Sequence[int], max_rows: int | None, max_bytes: int | None
) -> tuple[int, int]:
    """How many of the first messages, of ``sizes`` bytes each, make a batch, and their bytes:
    at most ``max_rows``, the longest run within ``max_bytes``, and at least one (if any)."""
    rows = len(sizes) if max_rows is None else min(max_rows, len(sizes))
    if max_bytes is None:
        return rows, sum(sizes[:rows])
    ends = list(accumulate(sizes[:rows]))
    rows = min(rows, max(1, bisect_right(ends, max_bytes)))
    return rows, ends[rows - 1] if rows else 0


@dataclass(frozen=True)
class Batch:
    """Messages taken from the buffer: their deliveries, and their encoded messages back to
    back in ``data``, ``sizes`` bytes each."""

    deliveries: list[Any]
    data: bytes
    sizes: array[int]


class QueueReceiver:
    """A connection and receiver link held open across micro-batches by the streaming runner.

    ``epoch`` names this connection: deliveries can only be settled on the link they arrived on,
    so offsets that carry another epoch refer to deliveries the gateway has already taken back.
    """

    def __init__(self, endpoint: Endpoint, credit: int) -> None:
        self.endpoint = endpoint
        self.credit = credit
        self.epoch = uuid.uuid4().hex
        self._lock = threading.Lock()
        # The pn_delivery_t * and encoded messages that arrived, in arrival order: the messages
        # back to back in one buffer with their sizes beside, so that a batch is taken from the
        # heads by slicing, not message by message.
        self._deliveries: list[Any] = []
        self._data = bytearray()
        self._sizes = array("I")
        self._stopping = threading.Event()
        # Trigger.AvailableNow: credit is only granted with the drain flag, and the query ends
        # once it has read what arrived before a drain found the queue empty.
        self._draining = False
        # Whether the gateway answered a drain with credit it had nothing to send for.
        self._found_empty = False
        self._failure: BaseException | None = None
        self._amqp = AmqpConnection.open(endpoint)
        try:
            self._link: Receiver = self._amqp.receiver(
                endpoint.address, timeout=endpoint.connect_timeout_s
            )
        except BaseException:
            self._amqp.close()
            raise
        self._impl = link_pointer(self._link)
        self._link.flow(credit)
        self._amqp.flush()
        self._thread = threading.Thread(
            target=self._run, name=f"sluicegate-receiver-{self.epoch[:8]}", daemon=True
        )
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        """Why the connection ended, if it did: its deliveries are back with the gateway."""
        return self._failure

    # -- the pump thread ----------------------------------------------------------------

    def _run(self) -> None:
        amqp = self._amqp
        try:
            while not self._stopping.is_set():
                amqp.await_input(POLL_S)
                with self._lock:
                    amqp.pump(0)
                    self._collect()
                    amqp.check(self._link)
        except (AmqpError, OSError) as error:
            self._failure = error

    def _collect(self) -> int:
        """Move every complete transfer from proton into the buffer; how many came."""
        deliveries, dropped = receive_transfers(
            self._impl, TAKE_PER_PASS, False, self._data, self._sizes
        )
        if lib.pn_link_drained(self._impl) > 0:
            # AMQP 1.0 §2.6.7: a sender with nothing to send advances its delivery-count past
            # the credit; everything it had sent before arrived before this answer.
            self._found_empty = True
        self._deliveries.extend(deliveries)
        if dropped:
            self._grant(dropped)  # an aborted transfer spent credit but carries no message
        return len(deliveries) + dropped

    def _grant(self, credit: int) -> None:
        if self._draining:
            lib.pn_link_drain(self._impl, credit)
        else:
            lib.pn_link_flow(self._impl, credit)

    # -- what the reader calls ----------------------------------------------------------

    def take(self, max_rows: int | None, max_bytes: int | None, timeout: float) -> Batch:
        """Up to ``max_rows`` buffered messages and ``max_bytes`` of them (at least one, if
        any arrived).

        While draining (Trigger.AvailableNow) the batch is filled first: it waits (up to
        ``timeout``) until the buffer holds a whole batch or the gateway has answered the
        drain, so the query reads in batches of the limit rather than of whatever had arrived.
        Nothing is returned (which ends the query) once the buffer is empty and some drain found
        the queue empty: every message that was there when the query started has been read.
        Waiting for the answer to the drain the last settlement armed would cost the time the
        gateway takes to process that batch's settlements, which arrived before it.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._failure is not None:
                    raise AmqpError(f"{self.endpoint.url}: connection lost: {self._failure}")
                full = (max_rows is not None and len(self._sizes) >= max_rows) or (
                    max_bytes is not None and len(self._data) >= max_bytes
                )
                if (
                    full
                    or not self._draining
                    or not lib.pn_link_draining(self._impl)
                    or (self._found_empty and not self._sizes)
                ):
                    return self._take(max_rows, max_bytes)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self.endpoint.address}: the gateway did not answer a drain within "
                    f"{timeout:g} s"
                )
            time.sleep(POLL_S / 5)

    def _take(self, max_rows: int | None, max_bytes: int | None) -> Batch:
        rows, size = batch_head(self._sizes, max_rows, max_bytes)
        batch = Batch(
            self._deliveries[:rows], bytes(memoryview(self._data)[:size]), self._sizes[:rows]
        )
        # Deleting from a bytearray's head moves its start, not its bytes.
        del self._deliveries[:rows], self._data[:size], self._sizes[:rows]
        return batch

    def accept(self, deliveries: list[Any]) -> None:
        """Settle deliveries ``accepted`` and give their credit back to the gateway."""
        if not deliveries:
            return
        update, settle, accepted = lib.pn_delivery_update, lib.pn_delivery_settle, lib.PN_ACCEPTED
        with self._lock:
            for delivery in deliveries:
                update(delivery, accepted)
                settle(delivery)
            if self._failure is None:
                self._grant(len(deliveries))
            self._amqp.flush()

    def drain(self) -> None:
        """From now on, have the gateway send what it has and say when it has nothing more.

        AMQP 1.0 §2.6.7: a draining sender uses up the credit or advances its delivery-count
        past it and answers with a FLOW, so an empty buffer after that FLOW is an empty queue.
        """
        with self._lock:
            self._draining = True
            lib.pn_link_drain(self._impl, 0)
            self._amqp.flush()

    def close(self, handed: list[Any]) -> None:
        """Give everything back and close: see the module docstring.

        ``handed`` are deliveries in batches Spark has not committed: they go back counted.
        """
        self._stopping.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        with self._lock:
            try:
                if self._failure is None and not self._amqp.closed:
                    self._give_back(handed)
            finally:
                self._amqp.close(CLOSE_TIMEOUT_S)

    def _give_back(self, handed: list[Any]) -> None:
        amqp, impl = self._amqp, self._impl
        unused = unused_credit(impl)
        if unused > 0:
            lib.pn_link_flow(impl, -unused)  # link-credit 0 at the gateway from its next FLOW
        amqp.flush()
        started = last = time.monotonic()
        while (
            now := time.monotonic()
        ) - last < IN_FLIGHT_QUIET_S and now - started < IN_FLIGHT_MAX_S:
            amqp.pump(IN_FLIGHT_QUIET_S / 4)
            if self._collect():
                last = time.monotonic()
        update, settle = lib.pn_delivery_update, lib.pn_delivery_settle
        for delivery in self._deliveries:
            update(delivery, lib.PN_RELEASED)
            settle(delivery)
        self._deliveries.clear()
        self._data.clear()
        del self._sizes[:]
        for delivery in handed:
            lib.pn_disposition_set_failed(lib.pn_delivery_local(delivery), True)
            update(delivery, lib.PN_MODIFIED)
            settle(delivery)
        amqp.flush()
