"""Load-generating clients, each in its own process so none shares the bench's GIL.

``SenderProcess`` runs ``sluicegate quiver``'s own sender (pre-encoded messages, credit used as
it comes) for a count or a duration: the prefill and the unthrottled publisher.
``ConsumerProcess`` is a paced receiver: it grants a large credit once and then takes
``rate`` messages per second, reading the socket only when it needs the next message, so a
server that pushes faster finds TCP's buffers full, as with a real slow application.
Both publish their counters to shared memory that the bench samples.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection as Channel
from multiprocessing.context import SpawnProcess
from typing import Any, Final

from proton import Delivery, Endpoint, Receiver

from sluicegate.clients.children import end
from sluicegate.clients.pump import Pump
from sluicegate.clients.quiver import sender
from sluicegate.clients.quiver.arrow import describe
from sluicegate.clients.quiver.reports import Failed, Scoreboard, SenderDone
from sluicegate.clients.quiver.settings import ArrowConfig

__all__ = ["ClientError", "ConsumerPlan", "ConsumerProcess", "SenderProcess"]

CONTEXT: Final = multiprocessing.get_context("spawn")
CONNECT_TIMEOUT_S: Final[float] = 30.0  # a loaded server still accepts within this
POLL_S: Final[float] = 0.02  # the consumer's longest wait for bytes while it has none to take
# After this long behind its pace the consumer starts counting afresh instead of bursting.
MAX_LAG_S: Final[float] = 1.0


class ClientError(RuntimeError):
    """A client process failed; the message is its one line."""


class SenderProcess:
    """The quiver sender in a process: ``count`` messages, or for ``duration`` seconds."""

    def __init__(
        self,
        host: str,
        port: int,
        address: str,
        *,
        body_size: int,
        count: int | None = None,
        duration: float | None = None,
        durable: bool = False,
        name: int = 1,
    ) -> None:
        self.board = Scoreboard(CONTEXT, 1)
        self.channel, theirs = CONTEXT.Pipe()
        config = ArrowConfig(
            role="sender",
            index=name,
            host=host,
            port=port,
            address=address,
            listen=False,
            count=count,
            duration=duration,
            body_size=body_size,
            credit=1,  # a sender's credit comes from the server; this field is the receiver's
            durable=durable,
            presettled=False,
            not_before_ns=time.time_ns(),
            timeout=CONNECT_TIMEOUT_S,
        )
        self.name = config.name
        self.process: SpawnProcess = CONTEXT.Process(
            target=sender.main, args=(config, theirs, self.board, 0), name=self.name, daemon=True
        )
        self.done: SenderDone | None = None

    def start(self) -> SenderProcess:
        """Start sending."""
        self.process.start()
        return self

    @property
    def sent(self) -> int:
        """Messages handed to the server so far."""
        return int(self.board.counts[0])

    @property
    def settled(self) -> int:
        """Outcomes received so far."""
        return int(self.board.settled[0])

    def poll(self) -> SenderDone | None:
        """The totals once the sender is done; ``ClientError`` if it failed or died."""
        if self.done is None and self.channel.poll():
            report = self.channel.recv()
            if isinstance(report, Failed):
                raise ClientError(f"{report.name}: {report.reason}")
            if isinstance(report, SenderDone):
                self.done = report
        if self.done is None and not self.process.is_alive() and not self.channel.poll():
            raise ClientError(f"{self.name} exited with status {self.process.exitcode}")
        return self.done

    def wait(self, timeout: float) -> SenderDone:
        """Block until done; ``ClientError`` when it fails or takes longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        while (done := self.poll()) is None:
            if time.monotonic() > deadline:
                raise ClientError(f"{self.name}: not done after {timeout:g} s ({self.sent:,} sent)")
            self.channel.poll(0.1)
        self.process.join(CONNECT_TIMEOUT_S)
        return done

    def stop(self) -> None:
        """End the process if it still runs."""
        end(self.process, CONNECT_TIMEOUT_S)


@dataclass(frozen=True, slots=True)
class ConsumerPlan:
    """What the consumer does: where (one link per address), its credit, its pace, how long."""

    host: str
    port: int
    addresses: tuple[str, ...]
    credit: int  # per link, topped up at half
    rate: float | None  # messages per second the application takes in all; None: no pacing
    duration: float  # seconds from the attach


def _ready(link: Receiver) -> Delivery | None:
    delivery: Delivery | None = link.current
    if delivery is not None and delivery.readable and not delivery.partial:
        return delivery
    return None


def consume_paced(plan: ConsumerPlan, channel: Channel, counts: Any) -> None:
    """Process entry point: grant ``credit`` on each link and take ``rate`` messages/s in all.

    ``counts`` is a shared ``RawArray('q', 1)``: messages taken. The channel gets one line on
    failure, ``None`` when done.
    """
    try:
        engine = Pump.connect(plan.host, plan.port, "bench consumer", CONNECT_TIMEOUT_S)
    except OSError as error:
        channel.send(f"consumer: cannot connect to {plan.host}:{plan.port}: {error.strerror}")
        return
    connection = engine.connection
    connection.open()
    session = connection.session()
    session.open()
    links: list[Receiver] = []
    for index, address in enumerate(plan.addresses):
        link = session.receiver(f"bench consumer {index}")
        link.source.address = address
        link.open()
        link.flow(plan.credit)
        links.append(link)
    interval = 0.0 if plan.rate is None else 1 / plan.rate
    end = time.monotonic() + plan.duration
    next_at = time.monotonic()
    taken = 0
    while (now := time.monotonic()) < end:
        engine.flush()
        ready = [(link, d) for link in links if (d := _ready(link)) is not None]
        if ready and now < next_at:
            time.sleep(min(next_at - now, end - now))
            continue
        for link, delivery in ready[:1] if interval else ready:
            link.recv(delivery.pending)
            link.advance()  # before settling: settling the current delivery advances too
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
            taken += 1
            if link.credit <= plan.credit // 2:
                link.flow(plan.credit - link.credit)
        if ready:
            counts[0] = taken
            next_at = max(next_at + interval, now - MAX_LAG_S)
            continue
        engine.pump(min(POLL_S, max(0.0, next_at - now)))
        for endpoint in (*links, connection):
            if endpoint.state & Endpoint.REMOTE_CLOSED:
                channel.send("consumer: " + describe(endpoint.remote_condition, "closed"))
                engine.close()
                return
        if engine.closed or engine.eof:
            channel.send(f"consumer: connection lost: {engine.error or 'end of stream'}")
            engine.close()
            return
    connection.close()
    engine.pump(POLL_S)
    engine.close()
    channel.send(None)


class ConsumerProcess:
    """``consume_paced`` in a process, with its counter readable from here."""

    def __init__(self, plan: ConsumerPlan) -> None:
        self.counts = CONTEXT.RawArray("q", 1)
        self.channel, theirs = CONTEXT.Pipe()
        self.process: SpawnProcess = CONTEXT.Process(
            target=consume_paced, args=(plan, theirs, self.counts), name="consumer", daemon=True
        )
        self.finished = False

    def start(self) -> ConsumerProcess:
        """Start consuming."""
        self.process.start()
        return self

    @property
    def taken(self) -> int:
        """Messages taken so far."""
        return int(self.counts[0])

    def poll(self) -> bool:
        """True once done; ``ClientError`` if it failed or died."""
        if not self.finished and self.channel.poll():
            reason = self.channel.recv()
            if reason is not None:
                raise ClientError(str(reason))
            self.finished = True
        if not self.finished and not self.process.is_alive() and not self.channel.poll():
            raise ClientError(f"consumer exited with status {self.process.exitcode}")
        return self.finished

    def stop(self) -> None:
        """End the process if it still runs."""
        end(self.process, CONNECT_TIMEOUT_S)
