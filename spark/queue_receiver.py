"""The driver-side receiver of ``mode=queue``: one link, a large credit window, nothing settled
until Spark says the micro-batch is committed.

Spark calls the streaming runner only when it plans or commits a batch, and a batch may take
long; so a daemon thread keeps pumping the connection (receiving into the buffer, answering
heartbeats, sending settlements) while Spark works. One lock guards every proton object: proton
is not thread-safe. Credit is the window minus what the connector holds (buffered or handed to
Spark and not yet accepted), so however slow Spark is, it never holds more than ``credit``
messages, and the gateway's own flow control bounds what is in flight on the socket.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from typing import Final

from proton import Delivery, Receiver

from sluicegate.spark.amqp import POLL_S, AmqpConnection, AmqpError
from sluicegate.spark.options import Endpoint

# How long a stopping receiver waits for its thread and for the gateway's CLOSE.
CLOSE_TIMEOUT_S: Final = 5.0


class QueueReceiver:
    """A connection and receiver link held open across micro-batches by the streaming runner.

    ``epoch`` names this connection: deliveries can only be settled on the link they arrived on,
    so offsets that carry another epoch refer to deliveries the gateway has already released.
    """

    def __init__(self, endpoint: Endpoint, credit: int) -> None:
        self.endpoint = endpoint
        self.credit = credit
        self.epoch = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._buffer: deque[tuple[Delivery, bytes]] = deque()
        self._stopping = threading.Event()
        # Trigger.AvailableNow: credit is only granted with the drain flag, and the query ends
        # at the first drain that leaves nothing to read.
        self._draining = False
        self._failure: BaseException | None = None
        self._amqp = AmqpConnection.open(endpoint)
        try:
            self._link: Receiver = self._amqp.receiver(
                endpoint.address, timeout=endpoint.connect_timeout_s
            )
        except BaseException:
            self._amqp.close()
            raise
        self._link.flow(credit)
        self._amqp.flush()
        self._thread = threading.Thread(
            target=self._run, name=f"sluicegate-receiver-{self.epoch[:8]}", daemon=True
        )
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        """Why the connection ended, if it did: its deliveries are released by the gateway."""
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

    def _collect(self) -> None:
        """Move every complete transfer from proton into the buffer."""
        link = self._link
        append = self._buffer.append
        delivery = link.current
        while delivery is not None and delivery.readable and not delivery.partial:
            payload = link.recv(delivery.pending) or b""
            link.advance()
            if delivery.aborted:
                delivery.settle()
                link.flow(1)  # an aborted transfer spent credit but carries no message
            else:
                append((delivery, payload))
            delivery = link.current

    # -- what the reader calls ----------------------------------------------------------

    def take(
        self, max_rows: int | None, max_bytes: int | None, timeout: float
    ) -> list[tuple[Delivery, bytes]]:
        """Up to ``max_rows`` buffered messages and ``max_bytes`` of them (at least one).

        While draining, an empty buffer is only an answer once the drain is complete (up to
        ``timeout``): an empty batch ends a Trigger.AvailableNow query.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                buffer = self._buffer
                if buffer or not self._draining or not self._link.draining():
                    return self._take(max_rows, max_bytes)
                if self._failure is not None:
                    raise AmqpError(f"connection lost while draining: {self._failure}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.endpoint.address}: the drain did not complete in time")
            time.sleep(POLL_S)

    def _take(self, max_rows: int | None, max_bytes: int | None) -> list[tuple[Delivery, bytes]]:
        taken: list[tuple[Delivery, bytes]] = []
        size = 0
        buffer = self._buffer
        rows = len(buffer) if max_rows is None else min(max_rows, len(buffer))
        while len(taken) < rows:
            size += len(buffer[0][1])
            if max_bytes is not None and size > max_bytes and taken:
                break
            taken.append(buffer.popleft())
        return taken

    def accept(self, deliveries: list[Delivery]) -> None:
        """Settle deliveries ``accepted`` and give their credit back to the gateway."""
        if not deliveries:
            return
        with self._lock:
            for delivery in deliveries:
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            if self._failure is None:
                if self._draining:
                    self._link.drain(len(deliveries))
                else:
                    self._link.flow(len(deliveries))
            self._amqp.flush()

    def drain(self) -> None:
        """From now on, have the gateway send what it has and say when it has nothing more.

        AMQP 1.0 §2.6.7: a draining sender uses up the credit or advances its delivery-count
        past it and answers with a FLOW, so an empty buffer after that FLOW is an empty queue.
        """
        with self._lock:
            self._draining = True
            self._link.drain(0)
            self._amqp.flush()

    def close(self) -> None:
        """Stop the thread and close the connection; the gateway releases what was unsettled."""
        self._stopping.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        with self._lock:
            self._amqp.close(CLOSE_TIMEOUT_S)
