"""The adversary's hands: raw connections that perform steps frame by frame.

Each connection slot holds a :class:`~support.raw_client.RawClient` (our own frame encoder, so
that nothing polite in between fixes what the step sends) and what the adversary knows of it:
which links it attached, which deliveries it received and may settle, whether it still reads
its socket. A step the server answers by closing the connection is not a failure of the step:
the slot is emptied and a later ``connect`` fills it again. Only the invariants judge the server.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import socket
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, uint, ulong
from proton._data import PythonAMQPData

from sluicegate.gateway.rules.outcomes import OUTCOMES
from sluicegate.queues.queue_homes import proposed_home
from support.adversary.http_requests import requests_of
from support.adversary.steps import HTTP_ACTION, QUEUES, Params, Step
from support.frames import AMQP_FRAME, FRAME_HEADER, ProtocolError, described, encode, encode_frame
from support.raw_client import AmqpError, LinkState, PeerClosedError, RawClient
from support.workers import serving_worker

__all__ = ["Fleet", "outcomes_field"]

# A step waits this long for an answer it needs (an ATTACH naming a dynamic address); the
# server owes it in milliseconds, and the prober, not this wait, judges its speed.
ANSWER_S: Final = 0.5
# A write blocked this long means the server stopped reading us (its right, under the budget):
# the connection is dropped, since a half-written frame cannot be continued.
WRITE_S: Final = 0.3
CONNECT_S: Final = 2.0
# How long a reject-fanout step goes on rejecting: long enough for its copies to fill the
# runs' 64 MiB budget when they are large, short beside the prober's 5 s limit.
REJECTING_S: Final = 2.0
# Frames read per connection after each step: enough to keep up, bounded so that a flood of
# deliveries cannot hold the adversary in one connection.
PUMP_FRAMES: Final = 2000
# Delivery ids remembered per session for dispositions (older ones are settled or forgotten).
RECEIVED_KEPT: Final = 512
LONG_SUBJECT: Final = "a" * 60_000  # for LIKE patterns: their cost grows with it
LEARNED_KEPT: Final = 16
HANGING_KEPT: Final = 300  # half-sent metrics and API requests held open at once
# Connections a `hoard-endpoints` step keeps open, oldest dropped first: with up to 40 links of
# 100 KiB each, more than a worker's account of endpoints holds (docs/bounds.md).
HOARDERS_KEPT: Final = 8
# An API answer may take a busy reactor's turn (gateway/http/): waited for this long, and one
# step's requests for this long in all, so that a server slow to answer slows the run little.
HTTP_ANSWER_S: Final = 2.0
HTTP_STEP_S: Final = 4.0
HTTP_STATUS: Final = re.compile(rb"HTTP/1\.[01] (\d{3})")
CONTENT_LENGTH: Final = re.compile(rb"(?im)^content-length:\s*(\d+)")
RECV_SIZE: Final = 65536  # dynamic and reply-to addresses the server answered with
STREAM_OFFSET: Final = "rabbitmq:stream-offset-spec"
SELECTOR: Final = "apache.org:selector-filter:string"
PROPERTIES_FILTER: Final = 0x173  # amqp:properties-filter, docs/filters.md
APPLICATION_PROPERTIES_FILTER: Final = 0x174
SQL_FILTER: Final = 0x120
# Message sections, AMQP 1.0 §3.2.
HEADER, ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES, DATA, VALUE = (
    0x70,
    0x72,
    0x73,
    0x74,
    0x75,
    0x77,
)
# What a step on an empty slot connects with: a well-behaved client's settings.
PLAIN_CONNECTION: Final[Params] = {
    "max_frame_size": 65536,
    "idle_ms": None,
    "sasl": True,
    "reading": True,
}
_SELECTORS: Final = {
    "selector-cheap": "subject = 'a'",
    "selector-deep": "(" * 40 + "subject = 'a'" + ")" * 40,
    "selector-long": " OR ".join(f"subject = 'v{i}'" for i in range(400)),
    "selector-bad": "subject = = 'a' AND",
    "selector-like": "subject LIKE '" + "%a" * 40 + "%b'",
}
# Outcomes a consumer's source may list that the server does not take (gateway/rules/
# outcomes.py's OUTCOMES are those it does): a delivery state that is no outcome, a
# transaction's, made-up ones.
UNKNOWN_OUTCOMES: Final = ("amqp:received:list", "amqp:declared:list", "x-adversary:outcome", "")
# Symbols in a long outcomes list: some 90 KB, so that its ATTACH fits the server's default
# max-frame-size (128 KiB; an ATTACH cannot span frames) and is taken whole, under
# max_attach_data_size (8 MiB, termini counted twice) for one link and past it for 48 on
# one connection. The server states a valid one back in its reply, and names the unknown ones
# of an unknown one in its error.
LONG_OUTCOMES: Final = 4000
# The adversary's queue names (steps.py), which a step aimed at another worker picks among.
_ADV_QUEUES: Final = tuple(f"adv-q{index}" for index in range(QUEUES))
# Errors that end a connection, not the adversary: the server closed it, or stopped reading.
_GONE: Final = (OSError, PeerClosedError, ProtocolError, ConnectionError)


def _section(code: int, value: PythonAMQPData) -> bytes:
    return encode(Described(ulong(code), value))


def message(
    body: int,
    *,
    to: str | None = None,
    subject: str | None = None,
    ttl: int | None = None,
    priority: int | None = None,
    annotations: dict[PythonAMQPData, PythonAMQPData] | None = None,
    message_id: PythonAMQPData = None,
    reply_to: str | None = None,
    value: PythonAMQPData = None,
) -> bytes:
    """An encoded message built section by section, so a TTL of 0 stays on the wire."""
    parts = []
    if ttl is not None or priority is not None:
        parts.append(
            _section(
                HEADER,
                [
                    None,
                    None if priority is None else ubyte(priority),
                    None if ttl is None else uint(ttl),
                ],
            )
        )
    if annotations:
        parts.append(_section(ANNOTATIONS, annotations))
    if to is not None or subject is not None or message_id is not None:
        parts.append(_section(PROPERTIES, [message_id, None, to, subject, reply_to]))
    parts.append(_section(APPLICATION_PROPERTIES, {"k": "v", "n": body}))
    if value is not None:
        parts.append(_section(VALUE, value))
    else:
        parts.append(_section(DATA, b"x" * body))
    return b"".join(parts)


@dataclass
class Slot:
    """One raw connection and what the adversary knows about it."""

    client: RawClient
    reading: bool
    detached: set[int] = field(default_factory=set)
    ended: set[int] = field(default_factory=set)  # channels we sent END on
    received: dict[int, deque[int]] = field(default_factory=dict)
    management: tuple[int, int] | None = None
    requests: int = 0
    # With --workers N: the index of the worker serving it, once a step needed it.
    worker: int | None = None

    def channels(self) -> list[int]:
        """Our sessions that have not ended, by channel."""
        return sorted(set(self.client.sessions) - self.ended)

    def links(self, role: str | None = None) -> list[LinkState]:
        """Our links not detached, whose session we still have, in handle order."""
        return [
            link
            for handle, link in sorted(self.client.links.items())
            if handle not in self.detached
            and link.channel in self.client.sessions
            and link.channel not in self.ended
            and (role is None or link.role == role)
        ]


class Fleet:
    """The adversary's connections to one server, and the addresses it learned."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics_port: int | None = None,
        workers: Sequence[int] = (),
        http_api_port: int | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.metrics_port = metrics_port
        self.http_api_port = http_api_port
        # The worker processes by index (--workers N), for the steps aimed at another
        # worker's queue; empty against one process.
        self.workers = list(workers)
        # Sockets to the metrics endpoint left open with half a request, oldest first.
        self.hanging: deque[socket.socket] = deque()
        # Connections holding links with large properties, oldest first (`hoard-endpoints`).
        self.hoarders: deque[RawClient] = deque()
        self.slots: dict[int, Slot] = {}
        self.learned: deque[str] = deque(maxlen=LEARNED_KEPT)
        self.dropped = 0  # connections the server closed on us or we dropped
        self.deliveries = 0  # whole messages the server sent us
        self.conditions: Counter[str] = Counter()  # errors the server answered with
        self.faults: Counter[str] = Counter()  # the adversary's own errors (see perform)

    def close(self) -> None:
        """Drop every connection."""
        for index in list(self.slots):
            self._forget(index)
        while self.hanging:
            self.hanging.popleft().close()
        while self.hoarders:
            self.hoarders.popleft().abort()

    def _forget(self, index: int) -> None:
        slot = self.slots.pop(index, None)
        if slot is not None:
            slot.client.abort()
            self.dropped += 1

    def perform(self, step: Step) -> None:
        """Do ``step``, then read what each reading connection was sent."""
        if step.action == "connect":
            self._connect(step.slot, step.params)
            self.pump()
            return
        if step.action == HTTP_ACTION:  # no AMQP connection of its own
            self._http_api(step)
            self.pump()
            return
        if step.slot not in self.slots:  # an empty slot gets a plain connection first
            self._connect(step.slot, PLAIN_CONNECTION)
        if step.slot in self.slots:
            try:
                getattr(self, "_" + step.action.replace("-", "_"))(self.slots[step.slot], step)
            except _GONE:
                self._forget(step.slot)
            except Exception as error:
                # The adversary's own bookkeeping lost track of a state the server led it into:
                # counted and reported, the connection dropped, the run goes on.
                self.faults[f"{step.action}: {error!r}"[:200]] += 1
                self._forget(step.slot)
        self.pump()

    def pump(self) -> None:
        """Read every reading connection's frames, noting the deliveries it may settle."""
        for index, slot in list(self.slots.items()):
            if not slot.reading:
                continue
            try:
                self._read(slot)
            except _GONE:
                self._forget(index)

    def _read(self, slot: Slot) -> None:
        client = slot.client
        for _ in range(PUMP_FRAMES):
            delivery = client.next_message(0)
            if delivery is None:
                break
            link = client.links.get(delivery.handle)
            self.deliveries += 1
            if link is not None and not delivery.settled:
                kept = slot.received.setdefault(link.channel, deque(maxlen=RECEIVED_KEPT))
                kept.append(delivery.delivery_id)
        for frame in client.received:
            if frame.performative in ("detach", "end", "close") and frame["error"] is not None:
                self.conditions[str(frame["error"]["condition"])] += 1
        client.received.clear()  # the adversary's own memory stays bounded on long runs

    # ----- connections and sessions -----

    def _connect(self, index: int, p: Params) -> None:
        self._forget(index)
        try:
            client = RawClient.connect(
                self.host,
                self.port,
                sasl=bool(p["sasl"]),
                max_frame_size=int(p["max_frame_size"] or 65536),
                idle_timeout_ms=None if p["idle_ms"] is None else int(p["idle_ms"]),
                container_id=f"adversary-{index}",
                timeout=CONNECT_S,
            )
        except (*_GONE, TimeoutError):
            return
        client.write_timeout = WRITE_S
        self.slots[index] = Slot(client, reading=bool(p["reading"]))
        try:
            client.begin(0, timeout=ANSWER_S)
        except (*_GONE, TimeoutError):
            self._forget(index)

    def _begin(self, slot: Slot, step: Step) -> None:
        p = step.params
        channel = int(p["channel"] or 0)
        if channel in slot.client.sessions and channel not in slot.ended:
            return
        slot.ended.discard(channel)
        with contextlib.suppress(TimeoutError):  # unanswered: later steps find out
            slot.client.begin(
                channel,
                incoming_window=int(p["incoming_window"] or 0),
                outgoing_window=int(p["outgoing_window"] or 0),
                handle_max=None if p["handle_max"] is None else int(p["handle_max"]),
                timeout=ANSWER_S,
            )

    def _end(self, slot: Slot, step: Step) -> None:
        channel = int(step.params["channel"] or 0)
        if channel not in slot.channels():
            return
        error = _error() if step.params["error"] else None
        slot.client.end(channel, error=error)
        slot.ended.add(channel)
        slot.received.pop(channel, None)
        if slot.management is not None and slot.client.links[slot.management[0]].channel == channel:
            slot.management = None

    def _close(self, slot: Slot, step: Step) -> None:
        """CLOSE, held by the budget or not: a held connection reads a CLOSE behind at most
        8 KiB of its input (wire/held_frames.py), so one left unanswered is counted."""
        try:
            slot.client.close(timeout=ANSWER_S)
        except TimeoutError:
            self.conditions["(CLOSE unanswered)"] += 1
        except _GONE:
            pass
        self.slots.pop(step.slot, None)

    def _drop(self, slot: Slot, step: Step) -> None:
        self._forget(step.slot)

    def _reset(self, slot: Slot, step: Step) -> None:
        self.slots.pop(step.slot, None)
        self.dropped += 1
        try:
            slot.client.reset()
        finally:
            slot.client.abort()  # reset's shutdown fails on a socket the server already closed

    def _reading(self, slot: Slot, step: Step) -> None:
        slot.reading = bool(step.params["reading"])

    def _garbage(self, slot: Slot, step: Step) -> None:
        p = step.params
        rng = random.Random(int(p["seed"] or 0))
        size = int(p["size"] or 1)
        kind = p["kind"]
        if kind == "random":
            data = rng.randbytes(size)
        elif kind == "bad-header":
            data = FRAME_HEADER.pack(4, 2, AMQP_FRAME, 0)
        elif kind == "truncated":
            data = FRAME_HEADER.pack(8 + size + 100, 2, AMQP_FRAME, 0) + rng.randbytes(size)
        elif kind == "huge-size":
            data = FRAME_HEADER.pack(2**32 - 1, 2, AMQP_FRAME, 0)
        else:
            data = FRAME_HEADER.pack(8 + size, 2, 0x77, 0) + rng.randbytes(size)
        slot.client.send_raw(data)

    # ----- links -----

    def _address(self, address: str | int | bool | None, pick: int) -> str | None:
        if address != "learned":
            return None if address is None else str(address)
        if not self.learned:
            return "/queues/adv-q0"
        return self.learned[pick % len(self.learned)]

    def _far(self, slot: Slot, step: Step, queue: str) -> str:
        """With --workers N and the step's ``far``: an adversary queue (``adv-qN``) another
        worker owns than the one serving ``slot``, so that what the step does crosses the
        channel (docs/workers.md); ``queue`` as it is otherwise."""
        if not self.workers or not step.params.get("far") or not queue.startswith("adv-q"):
            return queue
        if slot.worker is None:
            pid = serving_worker(self.port, slot.client.local_port, self.workers)
            slot.worker = -1 if pid is None else self.workers.index(pid)
        count = len(self.workers)
        far = [name for name in _ADV_QUEUES if proposed_home("/", name, count) != slot.worker]
        if not far or queue in far:
            return queue
        return far[_ADV_QUEUES.index(queue) % len(far)]

    def _placed(self, slot: Slot, step: Step, address: str | None) -> str | None:
        """``address``, its adversary queue aimed as :meth:`_far` says."""
        if address is None or not address.startswith("/queues/"):
            return address
        return "/queues/" + self._far(slot, step, address.removeprefix("/queues/"))

    def _attach(
        self,
        slot: Slot,
        step: Step,
        role: str,
        address: str | None,
        *,
        filters: dict[str, PythonAMQPData] | None = None,
        dynamic: bool = False,
        capabilities: Sequence[str] = (),
        expiry_policy: str | None = None,
        distribution: str | None = None,
        terminus: dict[str, PythonAMQPData] | None = None,
    ) -> int | None:
        p = step.params
        channel = int(p["channel"] or 0)
        if channel not in slot.channels():
            return None
        snd = p["snd_settle_mode"]
        rcv = p["rcv_settle_mode"]
        handle = slot.client.attach(
            f"adv-{step.slot}-{len(slot.client.links)}",
            "receiver" if role == "receiver" else "sender",
            source=address if role == "receiver" else None,
            target=address if role == "sender" else None,
            channel=channel,
            snd_settle_mode=snd if snd in ("unsettled", "settled", "mixed") else None,  # type: ignore[arg-type]
            rcv_settle_mode=rcv if rcv in ("first", "second") else None,  # type: ignore[arg-type]
            filters=filters,
            dynamic=dynamic,
            distribution_mode="copy" if distribution == "copy" else None,
            max_message_size=None if p["max_message_size"] is None else int(p["max_message_size"]),
            capabilities=capabilities,
            expiry_policy=expiry_policy,
            terminus=terminus,
        )
        if role == "receiver" and p["credit"]:
            slot.client.flow(handle, link_credit=int(p["credit"]), drain=bool(p["drain"]))
        return handle

    def _consume(
        self, slot: Slot, step: Step, filters: dict[str, PythonAMQPData] | None = None
    ) -> None:
        p = step.params
        filters = dict(filters or {})
        if p["stream_offset"] is not None:
            filters[STREAM_OFFSET] = str(p["stream_offset"])
        handle = self._attach(
            slot,
            step,
            "receiver",
            self._placed(slot, step, self._address(p["address"], int(p["credit"] or 0))),
            filters=filters or None,
            distribution="copy" if p["copy"] else None,
            terminus=outcomes_field(p),
        )
        if handle is not None:
            with contextlib.suppress(TimeoutError):  # refused or slow: later steps find out
                slot.client.wait_attach(handle, timeout=ANSWER_S)

    def _consume_filtered(self, slot: Slot, step: Step) -> None:
        kind = str(step.params["filter"])
        value: PythonAMQPData
        filters: dict[str, PythonAMQPData]
        if kind in _SELECTORS:
            filters = {"jms-selector": Described(symbol(SELECTOR), _SELECTORS[kind])}
        elif kind == "sql":
            value = " OR ".join(f"properties.subject = 'v{i}'" for i in range(50))
            filters = {"sql-filter": Described(ulong(SQL_FILTER), value)}
        elif kind == "properties":
            value = {symbol("subject"): "a"}
            filters = {"properties-filter": Described(ulong(PROPERTIES_FILTER), value)}
        elif kind == "application-properties":
            value = {"k": "v"}
            filters = {
                "application-properties-filter": Described(
                    ulong(APPLICATION_PROPERTIES_FILTER), value
                )
            }
        elif kind == "stream-filter":
            filters = {"rabbitmq:stream-filter": "a"}
        else:
            filters = {"bogus": Described(symbol("x-bogus:filter"), 1)}
        self._consume(slot, step, filters)

    def _publisher(self, slot: Slot, step: Step) -> None:
        p = step.params
        address = self._address(p["address"], len(slot.client.links))
        handle = self._attach(slot, step, "sender", self._placed(slot, step, address))
        if handle is not None:
            # Refused, or no credit yet: later steps may publish anyway.
            with contextlib.suppress(TimeoutError):
                slot.client.wait_credit(handle, timeout=ANSWER_S)

    def _dynamic(self, slot: Slot, step: Step) -> None:
        p = step.params
        capability = p["capability"]
        handle = None
        with slot.client.corked():
            for _ in range(int(p.get("repeat") or 1)):
                handle = self._attach(
                    slot,
                    step,
                    "receiver" if p["receiver"] else "sender",
                    None,
                    dynamic=True,
                    capabilities=() if capability is None else (str(capability),),
                    expiry_policy=None if p["expiry_policy"] is None else str(p["expiry_policy"]),
                )
        self._learn(slot, handle)

    def _direct_reply_to(self, slot: Slot, step: Step) -> None:
        """A Direct Reply-To requester (pre-settled, as RabbitMQ asks, or not), then replies
        sent to its address whether it gave credit or not."""
        p = step.params
        if p["settled"]:
            step = Step(step.action, step.slot, p | {"snd_settle_mode": "settled"})
        handle = self._attach(
            slot,
            step,
            "receiver",
            None,
            dynamic=True,
            capabilities=("rabbitmq:volatile-queue",),
            expiry_policy=None if p["expiry_policy"] is None else str(p["expiry_policy"]),
        )
        address = self._learn(slot, handle)
        if address is None or handle is None or not p["replies"]:
            return
        channel = slot.client.links[handle].channel
        name = f"adv-{step.slot}-{len(slot.client.links)}"
        replier = slot.client.attach(name, "sender", target=address, channel=channel)
        try:
            slot.client.wait_credit(replier, timeout=ANSWER_S)
        except TimeoutError:
            return
        for _ in range(min(int(p["replies"]), slot.client.links[replier].link_credit)):
            slot.client.send(replier, message(100), settled=True)

    def _learn(self, slot: Slot, handle: int | None) -> str | None:
        """The address the server named a dynamic node with, kept for later steps."""
        if handle is None:
            return None
        try:
            attached = slot.client.wait_attach(handle, timeout=ANSWER_S)
        except TimeoutError:
            return None
        address = attached.source_address or attached.target_address
        if address:
            self.learned.append(address)
        return address

    def _detach(self, slot: Slot, step: Step) -> None:
        links = slot.links()
        if not links:
            return
        link = links[int(step.params["pick"] or 0) % len(links)]
        error = _error() if step.params["error"] else None
        slot.client.detach(link.handle, closed=bool(step.params["closed"]), error=error)
        slot.detached.add(link.handle)

    # ----- transfers -----

    def _sender(self, slot: Slot, pick: int) -> LinkState | None:
        senders = [link for link in slot.links("sender") if link.handle != _mgmt(slot, 0)]
        return senders[pick % len(senders)] if senders else None

    def _publish(
        self,
        slot: Slot,
        step: Step,
        annotations: dict[PythonAMQPData, PythonAMQPData] | None = None,
    ) -> None:
        p = step.params
        pick = int(p["pick"] or 0)
        link = self._sender(slot, pick)
        if link is None:
            return
        payload = message(
            int(p["body"] or 0),
            to=self._address(p["to"], pick)
            if link.attach_reply is None or _null_target(link)
            else None,
            subject=LONG_SUBJECT if p["subject"] == "long" else _opt_str(p["subject"]),
            ttl=0 if p["ttl0"] else None,
            priority=None if p["priority"] is None else int(p["priority"]),
            annotations=annotations,
        )
        count = int(p["count"] or 1)
        if not p.get("overrun"):  # most publishers respect their credit; some do not
            count = min(count, link.link_credit)
        with slot.client.corked():
            for _ in range(count):
                slot.client.send(link.handle, payload, settled=bool(p["settled"]))

    def _publish_cc(self, slot: Slot, step: Step) -> None:
        kind = step.params["cc"]
        cc: PythonAMQPData
        if kind == "keys":
            cc = _amqp_list(["k", "a.b", "adv-q1", "adv-q2"])
        elif kind == "many-keys":
            cc = _amqp_list([*(f"adv-q{i % 5}.{i}" for i in range(2000)), "#"])
        elif kind == "not-a-list":
            cc = "adv-q3"
        elif kind == "empty":
            cc = _amqp_list([])
        else:
            cc = _amqp_list([1, "k", None, b"adv-q0"])
        self._publish(slot, step, {symbol("x-cc"): cc})

    def _publish_annotated(self, slot: Slot, step: Step) -> None:
        size = int(step.params["annotation_bytes"] or 0)
        self._publish(slot, step, {symbol("x-opt-adversary"): "a" * size})

    def _publish_unfinished(self, slot: Slot, step: Step) -> None:
        p = step.params
        link = self._sender(slot, int(p["pick"] or 0))
        if link is None:
            return
        chunk = b"u" * int(p["chunk"] or 1)
        slot.client.send(link.handle, message(0) + chunk, finish=False)
        for _ in range(int(p["frames"] or 1) - 1):
            slot.client.send_more(link.handle, chunk)
        if p["aborted"]:
            session = slot.client.sessions[link.channel]
            aborted = described("transfer", handle=uint(link.handle), aborted=True)
            slot.client.send_raw(encode_frame(session.channel, aborted))
        elif p["finish_later"]:
            slot.client.send_more(link.handle, chunk, finish=True)

    def _publish_oversized(self, slot: Slot, step: Step) -> None:
        link = self._sender(slot, int(step.params["pick"] or 0))
        if link is not None:
            slot.client.send(link.handle, message(int(step.params["body"] or 0)))

    # ----- flow and settlement -----

    def _flow(self, slot: Slot, step: Step) -> None:
        p = step.params
        client = slot.client
        window = None if p["incoming_window"] is None else int(p["incoming_window"])
        links = slot.links()
        if p["session_only"] or not links:
            channel = min(slot.channels(), default=None)
            if channel is not None:
                client.flow(channel=channel, incoming_window=window, echo=bool(p["echo"]))
            return
        link = links[int(p["pick"] or 0) % len(links)]
        if p["bad_handle"]:
            bad = described(
                "flow",
                incoming_window=uint(1),
                next_outgoing_id=uint(0),
                outgoing_window=uint(1),
                handle=uint(9999),
                link_credit=uint(int(p["credit"] or 0)),
            )
            client.send_raw(encode_frame(client.sessions[link.channel].channel, bad))
            return
        client.flow(
            link.handle,
            link_credit=int(p["credit"] or 0),
            drain=bool(p["drain"]),
            echo=bool(p["echo"]),
            incoming_window=window,
        )

    def _disposition(self, slot: Slot, step: Step) -> None:
        p = step.params
        channels = [c for c in slot.channels() if slot.received.get(c)]
        if not channels:
            return
        pick = int(p["pick"] or 0)
        channel = channels[pick % len(channels)]
        ids = slot.received[channel]
        first = ids[pick % len(ids)]
        last = (first + int(p["span"] or 0)) % 2**32
        size = p["annotation_bytes"]
        annotations: dict[PythonAMQPData, PythonAMQPData] | None = None
        if size is not None:
            annotations = {symbol("x-opt-adversary"): "m" * int(size)}
        when = _delivery_time(pick)
        if when is not None:
            # RabbitMQ 4.3's delayed retry (queues/delayed_returns.py), on any queue type.
            annotations = {**(annotations or {}), symbol("x-opt-delivery-time"): when}
        state: Described | None
        outcome = p["outcome"]
        if outcome == "modified":
            state = described(
                "modified",
                delivery_failed=bool(p["delivery_failed"]),
                undeliverable_here=bool(p["undeliverable_here"]),
                message_annotations=annotations,
            )
        elif outcome == "rejected":
            state = described("rejected", error=_error().encode())
        elif outcome == "received":
            state = described("received", section_number=uint(0), section_offset=ulong(0))
        elif outcome is None:
            state = None
        else:
            state = described(str(outcome))
        disposition = described(
            "disposition",
            role=not p["role_sender"],
            first=uint(first),
            last=uint(last),
            settled=bool(p["settled"]),
            state=state,
        )
        slot.client.send_raw(encode_frame(slot.client.sessions[channel].channel, disposition))
        if p["settled"]:
            slot.received[channel] = deque(
                (i for i in ids if not _within(i, first, last)), maxlen=RECEIVED_KEPT
            )

    # ----- management -----

    def _management_pair(self, slot: Slot, collect: bool) -> tuple[int, int] | None:
        if slot.management is not None:
            return slot.management
        client = slot.client
        channel = min(slot.channels(), default=None)
        if channel is None:
            return None
        name = f"adv-management-{len(client.links)}"
        paired = {"paired": True}
        sender = client.attach(
            name, "sender", target="/management", channel=channel, properties=paired
        )
        receiver = client.attach(
            name, "receiver", source="/management", channel=channel, properties=paired
        )
        if collect:
            client.flow(receiver, link_credit=100)
        slot.management = (sender, receiver)
        return slot.management

    def _manage(self, slot: Slot, step: Step) -> None:
        p = step.params
        pair = self._management_pair(slot, bool(p["collect"]))
        if pair is None:
            return
        sender, receiver = pair
        method, path, body = _request(p)
        self._requests(
            slot,
            sender,
            receiver,
            [(method, path, body)] * int(p["count"] or 1),
            bool(p["collect"]),
        )

    def _requests(
        self,
        slot: Slot,
        sender: int,
        receiver: int,
        requests: Sequence[tuple[str, str, PythonAMQPData]],
        collect: bool,
    ) -> None:
        """Send ``requests`` as the request link's credit allows, pumping for more credit."""
        for method, path, body in requests:
            if slot.client.links[sender].link_credit <= 0:
                try:
                    slot.client.wait_credit(sender, timeout=ANSWER_S)
                except TimeoutError:
                    return
            slot.requests += 1
            payload = message(
                0,
                to=path,
                subject=method,
                message_id=ulong(slot.requests),
                reply_to="$me",
                value=body,
            )
            slot.client.send(sender, payload, settled=True)
            if collect:
                slot.client.flow(receiver, link_credit=100)

    _manage_queue = _manage
    _manage_exchange = _manage
    _manage_bind = _manage
    _manage_delete = _manage
    _manage_read = _manage
    _manage_uncollected = _manage

    def _feed(
        self,
        slot: Slot,
        step: Step,
        channel: int,
        queue: str,
        count: int,
        body: int,
        *,
        until: float | None = None,
    ) -> int:
        """Up to ``count`` pre-settled messages of ``body`` bytes sent to ``queue`` by a new
        sender on ``channel``: one credit's worth, or with ``until`` (a monotonic time) credit
        after credit until then; how many went, 0 when no credit came within :data:`ANSWER_S`."""
        client = slot.client
        target = client.attach(
            f"adv-{step.slot}-{len(client.links)}",
            "sender",
            target=f"/queues/{queue}",
            channel=channel,
        )
        sent = 0
        while sent < count:
            try:
                credit = client.wait_credit(target, timeout=ANSWER_S)
            except TimeoutError:
                break
            for _ in range(min(credit, count - sent)):
                client.send(target, message(body), settled=True)
                sent += 1
            if until is None or time.monotonic() >= until:
                break
        return sent

    def _manage_cycle(self, slot: Slot, step: Step) -> None:
        """Two queues dead-lettering into each other through two exchanges, fed by a third
        queue whose consumer rejects (so the dead letters carry a rejection), in one step."""
        p = step.params
        pair = self._management_pair(slot, collect=True)
        if pair is None:
            return
        feed, first, second = (
            self._far(slot, step, str(p["feed"])),
            str(p["queue"]),
            str(p["other_queue"]),
        )
        into_first, into_second = str(p["exchange"]), str(p["other_exchange"])
        looping: dict[PythonAMQPData, PythonAMQPData] = {}
        if p["ttl"] is not None:
            looping["x-message-ttl"] = ulong(int(p["ttl"]))
        if p["max_length"] is not None:
            looping["x-max-length"] = ulong(int(p["max_length"]))
        requests: list[tuple[str, str, PythonAMQPData]] = [
            *(("DELETE", f"/queues/{_quote(q)}", None) for q in (feed, first, second)),
            ("PUT", f"/exchanges/{_quote(into_first)}", _exchange_body("fanout")),
            ("PUT", f"/exchanges/{_quote(into_second)}", _exchange_body("fanout")),
            ("PUT", f"/queues/{_quote(feed)}", _queue_body({"x-dead-letter-exchange": into_first})),
            (
                "PUT",
                f"/queues/{_quote(first)}",
                _queue_body(looping | {"x-dead-letter-exchange": into_second}),
            ),
            (
                "PUT",
                f"/queues/{_quote(second)}",
                _queue_body(looping | {"x-dead-letter-exchange": into_first}),
            ),
            ("POST", "/bindings", _binding(into_first, first, queue=True)),
            ("POST", "/bindings", _binding(into_second, second, queue=True)),
        ]
        self._requests(slot, *pair, requests, collect=True)
        channel = slot.client.links[pair[0]].channel
        count = self._feed(slot, step, channel, feed, int(p["messages"] or 1), 100)
        if not count or not p["reject"]:
            return
        name = f"adv-{step.slot}-{len(slot.client.links)}"
        source = slot.client.attach(name, "receiver", source=f"/queues/{feed}", channel=channel)
        slot.client.flow(source, link_credit=count)
        deadline = time.monotonic() + ANSWER_S
        rejected_count = 0
        while rejected_count < count and time.monotonic() < deadline:
            got = slot.client.next_message(max(0.0, deadline - time.monotonic()))
            if got is None:
                return
            if got.handle != source:
                continue  # a management reply
            rejected_count += 1
            rejected = described("rejected", error=_error().encode())
            disposition = described(
                "disposition", role=True, first=uint(got.delivery_id), settled=True, state=rejected
            )
            slot.client.send_raw(encode_frame(slot.client.sessions[channel].channel, disposition))

    def _reject_fanout(self, slot: Slot, step: Step) -> None:
        """A reject loop through a fanout: ``feed`` dead-letters into a fanout bound back to it
        and to ``width`` - 1 queues nobody consumes; its consumer rejects every message it
        gets for up to :data:`REJECTING_S` (issue 31: the fan-out is the consumer's doing,
        held at its connection's dead-letter debt, docs/bounds.md)."""
        p = step.params
        pair = self._management_pair(slot, collect=True)
        if pair is None:
            return
        feed, fan = self._far(slot, step, str(p["feed"])), str(p["exchange"])
        width = int(p["width"] or 2)
        sinks = [f"adv-fan{index}" for index in range(width - 1)]
        requests: list[tuple[str, str, PythonAMQPData]] = [
            ("DELETE", f"/queues/{_quote(feed)}", None),
            ("PUT", f"/exchanges/{_quote(fan)}", _exchange_body("fanout")),
            ("PUT", f"/queues/{_quote(feed)}", _queue_body({"x-dead-letter-exchange": fan})),
            *(("PUT", f"/queues/{sink}", _queue_body({})) for sink in sinks),
            ("POST", "/bindings", _binding(fan, feed, queue=True)),
            *(("POST", "/bindings", _binding(fan, sink, queue=True)) for sink in sinks),
        ]
        self._requests(slot, *pair, requests, collect=True)
        channel = slot.client.links[pair[0]].channel
        if not self._feed(slot, step, channel, feed, int(p["messages"] or 1), int(p["body"] or 0)):
            return
        name = f"adv-{step.slot}-{len(slot.client.links)}"
        source = slot.client.attach(name, "receiver", source=f"/queues/{feed}", channel=channel)
        credit = int(p["credit"] or 1)
        slot.client.flow(source, link_credit=credit)
        if p["unsettled"]:
            return
        deadline = time.monotonic() + REJECTING_S
        while (left := deadline - time.monotonic()) > 0:
            got = slot.client.next_message(left)
            if got is None:
                return
            if got.handle != source:
                continue  # a management reply
            rejected = described("rejected", error=_error().encode())
            disposition = described(
                "disposition", role=True, first=uint(got.delivery_id), settled=True, state=rejected
            )
            slot.client.send_raw(encode_frame(slot.client.sessions[channel].channel, disposition))
            if slot.client.links[source].link_credit <= credit // 2:
                slot.client.flow(source, link_credit=credit)

    def _delivery_limit(self, slot: Slot, step: Step) -> None:
        """``messages`` for a queue with ``x-delivery-limit`` that dead-letters into a fanout
        bound to ``width`` queues nobody consumes, taken unsettled by one link and let go as
        ``end`` says (the connection dropped or closed, the link detached): each comes back a
        failed attempt, and at its limit is a letter whose cause is gone (docs/bounds.md)."""
        p = step.params
        pair = self._management_pair(slot, collect=True)
        if pair is None:
            return
        feed, fan = self._far(slot, step, str(p["feed"])), str(p["exchange"])
        sinks = [f"adv-fan{index}" for index in range(int(p["width"] or 2))]
        arguments: dict[PythonAMQPData, PythonAMQPData] = {
            "x-dead-letter-exchange": fan,
            "x-delivery-limit": ulong(int(p["limit"] or 0)),
        }
        requests: list[tuple[str, str, PythonAMQPData]] = [
            ("DELETE", f"/queues/{_quote(feed)}", None),
            ("PUT", f"/exchanges/{_quote(fan)}", _exchange_body("fanout")),
            ("PUT", f"/queues/{_quote(feed)}", _queue_body(arguments)),
            *(("PUT", f"/queues/{sink}", _queue_body({})) for sink in sinks),
            *(("POST", "/bindings", _binding(fan, sink, queue=True)) for sink in sinks),
        ]
        self._requests(slot, *pair, requests, collect=True)
        client = slot.client
        channel = client.links[pair[0]].channel
        deadline = time.monotonic() + REJECTING_S
        count, body = int(p["messages"] or 1), int(p["body"] or 0)
        sent = self._feed(slot, step, channel, feed, count, body, until=deadline)
        source = client.attach(
            f"adv-{step.slot}-{len(client.links)}",
            "receiver",
            source=f"/queues/{feed}",
            channel=channel,
        )
        client.flow(source, link_credit=max(sent, 1))
        taken = 0
        while taken < sent and (left := deadline - time.monotonic()) > 0:
            got = client.next_message(left)
            if got is None:
                break
            taken += got.handle == source
        end = p["end"]
        if end == "detach":
            client.detach(source)
            slot.detached.add(source)
        elif end == "close":
            self._close(slot, step)
        else:
            self._forget(step.slot)

    def _manage_chain(self, slot: Slot, step: Step) -> None:
        """``length`` exchanges, each bound to the next, then the head deleted (a cascade)."""
        p = step.params
        pair = self._management_pair(slot, collect=True)
        if pair is None:
            return
        length, prefix = int(p["length"] or 1), str(p["prefix"])
        names = [f"{prefix}-{i}" for i in range(length)]
        body = _exchange_body("fanout") | {"auto_delete": bool(p["auto_delete"])}
        requests: list[tuple[str, str, PythonAMQPData]] = [
            ("PUT", f"/exchanges/{name}", body) for name in names
        ]
        requests += [
            ("POST", "/bindings", _binding(a, b, queue=False)) for a, b in itertools.pairwise(names)
        ]
        requests.append(("DELETE", f"/exchanges/{names[0]}", None))
        self._requests(slot, *pair, requests, collect=True)

    def _topic_cc(self, slot: Slot, step: Step) -> None:
        """Bind many keys on a topic exchange, then publish messages with many x-cc keys."""
        p = step.params
        pair = self._management_pair(slot, collect=True)
        if pair is None:
            return
        exchange = str(p["exchange"])
        requests: list[tuple[str, str, PythonAMQPData]] = [
            ("PUT", f"/exchanges/{exchange}", _exchange_body("topic")),
            *(("PUT", f"/queues/adv-q{i}", _queue_body({})) for i in range(QUEUES)),
        ]
        for i in range(int(p["bindings"] or 1)):
            binding = _binding(exchange, f"adv-q{i % 5}", queue=True)
            requests.append(("POST", "/bindings", binding | {"binding_key": f"*.{i}.#"}))
        self._requests(slot, *pair, requests, collect=True)
        channel = slot.client.links[pair[0]].channel
        name = f"adv-{step.slot}-{len(slot.client.links)}"
        target = slot.client.attach(
            name, "sender", target=f"/exchanges/{exchange}/k", channel=channel
        )
        try:
            slot.client.wait_credit(target, timeout=ANSWER_S)
        except TimeoutError:
            return
        keys = _amqp_list(f"a.{i}.b.c" for i in range(int(p["keys"] or 1)))
        payload = message(10, annotations={symbol("x-cc"): keys})
        for _ in range(min(int(p["messages"] or 1), slot.client.links[target].link_credit)):
            slot.client.send(target, payload, settled=False)

    def _metrics(self, slot: Slot, step: Step) -> None:
        """Requests to the metrics endpoint (HTTP, not AMQP): whole ones, half ones left open,
        bytes that are no request at all."""
        if self.metrics_port is None:
            return
        how = step.params["how"]
        for _ in range(int(step.params["sockets"] or 1)):
            try:
                sock = socket.create_connection(("127.0.0.1", self.metrics_port), timeout=CONNECT_S)
            except OSError:
                return
            try:
                if how == "scrape":
                    sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: adversary\r\n\r\n")
                    sock.settimeout(ANSWER_S)
                    sock.recv(RECV_SIZE)  # the answer's start: the endpoint served it
                elif how == "half":
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: adv")
                    self.hanging.append(sock)
                    if len(self.hanging) > HANGING_KEPT:
                        self.hanging.popleft().close()
                    continue
                else:
                    sock.sendall(b"\x00AMQP\x00\x01\x00\x00" * 8)
            except OSError:
                pass  # refused, reset or slow: what the endpoint does is the server's business
            sock.close()

    def _http_api(self, step: Step) -> None:
        """Requests to RabbitMQ's HTTP API (support/adversary/http_requests.py), on one
        connection: each sent once the last was answered, all sent before reading any, or the
        first half sent and the connection left open. Answers are counted by status, as
        ``http NNN``, with the AMQP errors."""
        if self.http_api_port is None:
            return
        requests = requests_of(step.params)
        try:
            sock = socket.create_connection(("127.0.0.1", self.http_api_port), timeout=CONNECT_S)
        except OSError:
            return
        how = step.params["how"]
        try:
            if how == "half":
                first = requests[0]
                sock.sendall(first[: max(1, len(first) // 2)])
                self.hanging.append(sock)
                if len(self.hanging) > HANGING_KEPT:
                    self.hanging.popleft().close()
                return
            deadline = time.monotonic() + HTTP_STEP_S
            if how == "pipelined":
                sock.sendall(b"".join(requests))
                self._answers(sock, len(requests), deadline)
            else:
                for request in requests:
                    sock.sendall(request)
                    if not self._answers(sock, 1, deadline):
                        break
        except OSError:
            pass  # refused, reset or slow: what the API does is the server's business
        sock.close()

    def _answers(self, sock: socket.socket, count: int, deadline: float) -> bool:
        """Read ``count`` answers (until ``deadline``), counting their statuses; False if the
        server closed or did not answer them all in time."""
        buffered = b""
        for _ in range(count):
            while b"\r\n\r\n" not in buffered:
                chunk = _received(sock, deadline)
                if not chunk:
                    return False
                buffered += chunk
            head, _, buffered = buffered.partition(b"\r\n\r\n")
            status = HTTP_STATUS.match(head)
            self.conditions[f"http {status.group(1).decode() if status else '???'}"] += 1
            length = CONTENT_LENGTH.search(head)
            remaining = int(length.group(1)) if length else 0
            while len(buffered) < remaining:
                chunk = _received(sock, deadline)
                if not chunk:
                    return False
                buffered += chunk
            buffered = buffered[remaining:]
        return True

    def _extra(self, name: str) -> RawClient | None:
        """A connection of a step's own, outside the slots; None if the server would not have
        it (closed, or too slow to open)."""
        try:
            client = RawClient.connect(self.host, self.port, container_id=name, timeout=CONNECT_S)
        except (*_GONE, TimeoutError):
            return None
        client.write_timeout = WRITE_S
        return client

    def _churn(self, slot: Slot, step: Step) -> None:
        """Open connections (with links) and leave them at once, as a crashing fleet would."""
        p = step.params
        for index in range(int(p["connections"] or 1)):
            client = self._extra(f"adv-churn-{index}")
            if client is None:
                continue
            try:
                if p["links"]:
                    client.begin(0, timeout=ANSWER_S)
                with client.corked():
                    for link in range(int(p["links"] or 0)):
                        client.attach(
                            f"churn-{link}", "receiver", source=f"/queues/adv-q{link % 5}"
                        )
                        client.attach(f"churn-{link}", "sender", target=f"/queues/adv-q{link % 5}")
                if p["how"] == "close":
                    client.close(timeout=ANSWER_S)
                elif p["how"] == "reset":
                    client.reset()
                else:
                    client.abort()
            except (*_GONE, TimeoutError):
                client.abort()
            self.dropped += 1

    def _hoard_endpoints(self, slot: Slot, step: Step) -> None:
        """Connections kept open, each attaching links with large properties and reading
        nothing: the server's account of endpoints filled while the prober connects again."""
        p = step.params
        properties: dict[str, PythonAMQPData] = {"hoard": "x" * (int(p["kib"] or 0) * 1024)}
        for index in range(int(p["connections"] or 1)):
            client = self._extra(f"adv-hoard-{index}")
            if client is None:
                continue
            self.hoarders.append(client)
            while len(self.hoarders) > HOARDERS_KEPT:
                self.hoarders.popleft().abort()
                self.dropped += 1
            try:
                client.begin(0, timeout=ANSWER_S)
                with client.corked():
                    for link in range(int(p["links"] or 0)):
                        client.attach(
                            f"hoard-{link}",
                            "sender",
                            target=f"/queues/adv-q{link % QUEUES}",
                            properties=properties,
                        )
            except (*_GONE, TimeoutError):
                # The server closed it (no room left in its account) or stopped reading it.
                self.hoarders.remove(client)
                client.abort()
                self.dropped += 1


def _received(sock: socket.socket, deadline: float) -> bytes:
    """What the socket gives within :data:`HTTP_ANSWER_S` and before ``deadline`` (b"" if
    nothing: closed or late)."""
    left = min(HTTP_ANSWER_S, deadline - time.monotonic())
    if left <= 0:
        return b""
    sock.settimeout(left)
    try:
        return sock.recv(RECV_SIZE)
    except TimeoutError:
        return b""


def _mgmt(slot: Slot, index: int) -> int | None:
    return None if slot.management is None else slot.management[index]


def _null_target(link: LinkState) -> bool:
    reply = link.attach_reply
    return reply is not None and reply["target"] is not None and reply["target"]["address"] is None


def _within(delivery_id: int, first: int, last: int) -> bool:
    return (delivery_id - first) % 2**32 <= (last - first) % 2**32


def _error() -> AmqpError:
    return AmqpError("amqp:internal-error", "adversary")


def _opt_str(value: int | str | bool | None) -> str | None:
    return None if value is None else str(value)


def _amqp_list(items: Iterable[PythonAMQPData]) -> PythonAMQPData:
    return list(items)


# What a ``modified`` outcome asks of x-opt-delivery-time, by the step's ``pick`` (drawn with
# it, so that the seeds' streams stay as they were): mostly nothing; else the past, a second
# from now, the far future (parked for good), a negative time, a time that is not a number.
_DELIVERY_TIMES: Final = (None, None, None, None, "past", "soon", "far", "negative", "text")


def _delivery_time(pick: int) -> PythonAMQPData:
    kind = _DELIVERY_TIMES[pick // 7 % len(_DELIVERY_TIMES)]
    if kind is None:
        return None
    times: dict[str, int | str] = {
        "past": 1,
        "soon": int(time.time() * 1000) + 1000,
        "far": 2**62,
        "negative": -1,
        "text": "tomorrow",
    }
    return times[kind]


def outcomes_field(p: Params) -> dict[str, PythonAMQPData] | None:
    """The ``outcomes`` field of a consumer's source as the step drew it (steps.py), or None
    for a source without one (older reproductions have no such parameter)."""
    kind = p.get("outcomes")
    if kind is None:
        return None
    pick = int(p.get("outcomes_pick") or 0)
    if kind == "single":  # a multiple field of one may be the value alone (§1.6)
        return {"outcomes": symbol(OUTCOMES[pick % len(OUTCOMES)])}
    listed: list[str]
    if kind == "valid":  # a non-empty subset, in an order of the pick's
        listed = [o for bit, o in enumerate(OUTCOMES) if pick >> bit & 1] or [OUTCOMES[0]]
        listed = listed[pick >> 4 & 3 :] + listed[: pick >> 4 & 3]
    elif kind == "unknown":
        unknown = UNKNOWN_OUTCOMES[pick // len(OUTCOMES) % len(UNKNOWN_OUTCOMES)]
        listed = [OUTCOMES[pick % len(OUTCOMES)], unknown]
    elif kind == "long":
        listed = [OUTCOMES[index % len(OUTCOMES)] for index in range(LONG_OUTCOMES)]
    elif kind == "long-unknown":
        listed = [f"x:{index}" for index in range(LONG_OUTCOMES)]
    else:
        listed = []
    undescribed: Any = UNDESCRIBED  # proton types an Array's descriptor as data
    return {"outcomes": Array(undescribed, Data.SYMBOL, *map(symbol, listed))}


def _exchange_body(kind: str) -> dict[PythonAMQPData, PythonAMQPData]:
    return {
        "type": kind,
        "durable": False,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
    }


def _queue_body(
    arguments: dict[PythonAMQPData, PythonAMQPData],
) -> dict[PythonAMQPData, PythonAMQPData]:
    return {"durable": False, "exclusive": False, "auto_delete": False, "arguments": arguments}


def _binding(source: str, destination: str, *, queue: bool) -> dict[PythonAMQPData, PythonAMQPData]:
    kind = "destination_queue" if queue else "destination_exchange"
    return {"source": source, kind: destination, "binding_key": "", "arguments": {}}


def _quote(name: str) -> str:
    return name.replace("%", "%25").replace("/", "%2F")


def _request(p: dict[str, int | str | bool | None]) -> tuple[str, str, PythonAMQPData]:
    """The method, path and body of a management request (docs/management.md)."""
    request = p["request"]
    queue = _quote(str(p["queue"]))
    exchange = _quote(str(p["exchange"]))
    if request == "declare-queue":
        arguments: dict[PythonAMQPData, PythonAMQPData] = {}
        if p["queue_type"] is not None:
            arguments["x-queue-type"] = str(p["queue_type"])
        if p["ttl"] is not None:
            arguments["x-message-ttl"] = ulong(int(p["ttl"]))
        if p["dead_letter"] == "exchange":
            arguments["x-dead-letter-exchange"] = str(p["other_exchange"])
            arguments["x-dead-letter-routing-key"] = str(p["key"])
        elif p["dead_letter"] == "default":
            arguments["x-dead-letter-exchange"] = ""
            arguments["x-dead-letter-routing-key"] = str(p["queue"])
        if p["max_length"] is not None:
            arguments["x-max-length"] = ulong(int(p["max_length"]))
        if p["overflow"] is not None:
            arguments["x-overflow"] = str(p["overflow"])
        if p["expires"] is not None:
            arguments["x-expires"] = ulong(int(p["expires"]))
        body: PythonAMQPData = {
            "durable": p["queue_type"] in ("quorum", "stream"),
            "exclusive": False,
            "auto_delete": False,
            "arguments": arguments,
        }
        return "PUT", f"/queues/{queue}", body
    if request == "declare-exchange":
        body = {
            "type": str(p["exchange_type"]),
            "durable": False,
            "auto_delete": False,
            "internal": False,
            "arguments": {},
        }
        return "PUT", f"/exchanges/{exchange}", body
    if request == "bind-queue":
        body = {
            "source": str(p["exchange"]),
            "destination_queue": str(p["queue"]),
            "binding_key": str(p["key"]),
            "arguments": {},
        }
        return "POST", "/bindings", body
    if request == "bind-exchange":
        body = {
            "source": str(p["exchange"]),
            "destination_exchange": str(p["other_exchange"]),
            "binding_key": str(p["key"]),
            "arguments": {},
        }
        return "POST", "/bindings", body
    if request == "delete-queue":
        return "DELETE", f"/queues/{queue}", None
    if request == "delete-exchange":
        return "DELETE", f"/exchanges/{exchange}", None
    if request == "purge":
        return "DELETE", f"/queues/{queue}/messages", None
    if request == "list-queues":
        return "GET", "/queues", None
    if request == "get-queue":
        return "GET", f"/queues/{queue}", None
    return "PATCH", "/nowhere/at/all", None
