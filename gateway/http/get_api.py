"""RabbitMQ's ``POST /api/queues/{vhost}/{name}/get``: look at a queue's first messages.

The messages are taken as a consumer takes them (``attach``, ``credit``, ``settle``, ``detach``
of the queue's own API), so ordering, paging from the log and held bytes stay the queue's: with
``ack_requeue_true`` or ``reject_requeue_true`` they are released back to their places, in order,
counted as the queue counts a release over AMQP (a quorum queue's returned count, as RabbitMQ 4's
acquired count, makes them ``redelivered`` next time; a release raises no delivery-count); with
``ack_requeue_false`` they are accepted, so removed. Streams answer as RabbitMQ's do (a get is
not supported by stream queues). Bounded: at most :data:`MAX_COUNT` messages and
:data:`MAX_READ_BYTES` of them per request on the reactor (one job at a time), and
:data:`MAX_REPLY_PAYLOAD` bytes of payload in the reply, shared between its messages: they are
decoded and cut in the job, so a request holds its reply's bytes, not its messages', once the
job is done.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from proton import Message as ProtonMessage

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.loops_api import ApiError
from sluicegate.gateway.http.reactor_calls import ReactorCalls
from sluicegate.gateway.rules.auth import User
from sluicegate.queues.queue_type import Dispatch, Outcome
from sluicegate.queues.stream import StreamQueue

# Messages one request may take: RabbitMQ's UI asks for 1 by default; a hundred is more than a
# person reads, few enough that one request is one short job on the reactor.
MAX_COUNT: Final = 100
# Bytes of messages one request reads on the reactor: it stops taking messages once past it
# (some 2 messages of the default max_message_size), so a count of large ones is not 800 MiB.
MAX_READ_BYTES: Final = 16 * 1024 * 1024
# Bytes of payload in one reply, shared by its messages (each is truncated to its share).
MAX_REPLY_PAYLOAD: Final = 1024 * 1024
# AMQP 1.0's priority when the header has none (§3.2.1): not shown, as RabbitMQ does not.
DEFAULT_PRIORITY: Final = 4
_ACKMODES: Final = {
    "ack_requeue_true": False,
    "reject_requeue_true": False,
    "ack_requeue_false": True,
}


@dataclass(frozen=True, slots=True)
class _Got:
    """A message taken: its bytes and how it was published, read on the reactor."""

    payload: bytes
    exchange: str
    routing_key: str
    redelivered: bool


class GetApi:
    """Gets messages from a queue, on the reactor, and shapes them as RabbitMQ does."""

    def __init__(self, broker: Broker, calls: ReactorCalls, timeout: float) -> None:
        self._broker = broker
        self._calls = calls
        self._timeout = timeout

    async def get(self, user: User, vhost: str, queue: str, body: object) -> list[object]:
        """RabbitMQ's list of messages; raises ApiError."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        count = body.get("count", 1)
        if not (isinstance(count, int) and 1 <= count <= MAX_COUNT):
            raise ApiError(400, f"count must be 1 to {MAX_COUNT}")
        consume = _ACKMODES.get(str(body.get("ackmode")))
        if consume is None:
            raise ApiError(400, f"ackmode must be one of {', '.join(_ACKMODES)}")
        encoding = body.get("encoding", "auto")
        if encoding not in ("auto", "base64"):
            raise ApiError(400, "encoding must be 'auto' or 'base64'")
        truncate = body.get("truncate")
        if truncate is not None and not (isinstance(truncate, int) and truncate >= 0):
            raise ApiError(400, "truncate must be a number of bytes")
        share = MAX_REPLY_PAYLOAD // count
        limit = share if truncate is None else min(truncate, share)
        return await self._calls.call(
            lambda: self._take(user, vhost, queue, count, consume, (encoding == "base64", limit)),
            self._timeout,
        )

    def _take(
        self,
        user: User,
        vhost_name: str,
        name: str,
        count: int,
        consume: bool,
        shape: tuple[bool, int],
    ) -> list[object]:
        """On the reactor: take up to ``count`` messages, release or accept them, and shape
        them here, so that what outlives the job is the reply's bytes, not the messages'."""
        broker = self._broker
        vhost = broker.tenancy.vhosts.get(vhost_name)
        if vhost is None:
            raise ApiError(404, f"no vhost '{vhost_name}'")
        permissions = user.permissions(vhost_name)
        if permissions is None:
            raise ApiError(401, f"user '{user.name}' has no access to vhost '{vhost_name}'")
        if not permissions.allows("read", name):
            raise ApiError(403, f"user '{user.name}' may not read queue '{name}'")
        queue = vhost.registry.get(name)
        if queue is None:
            raise ApiError(404, f"no queue '{name}' in vhost '{vhost_name}'")
        if vhost.registry.owner(name) is not None:
            # An exclusive queue is its connection's alone (the management router's 400).
            raise ApiError(
                400,
                f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost_name}'",
            )
        if isinstance(queue, StreamQueue):
            raise ApiError(
                400,
                f"basic.get not supported by stream queues queue '{name}' in vhost '{vhost_name}'",
            )
        key = object()
        queue.attach(key, ack_required=True)
        taken: list[tuple[int, _Got]] = []
        dispatches: list[Dispatch] = []
        try:
            read = 0
            while len(taken) < count and read < MAX_READ_BYTES:
                messages, _ = queue.credit(key, len(taken), 1, True)
                if not messages:
                    break
                message = messages[0]
                payload = message.read()
                read += len(payload)
                redelivered = message.returned > 0 or message.delivery_count > 0
                taken.append(
                    (message.seq, _Got(payload, message.exchange, message.routing_key, redelivered))
                )
            if taken:
                outcome = Outcome.ACCEPTED if consume else Outcome.RELEASED
                dispatches = queue.settle(key, [seq for seq, _ in taken], outcome, False)
        finally:
            dispatches = [*dispatches, *queue.detach(key, [])]
            if dispatches:
                broker.publishing.dispatch(dispatches)
        remaining = queue.statistics().ready - (0 if consume else len(taken))
        return [
            _shape(got, remaining + len(taken) - index - 1, *shape)
            for index, (_, got) in enumerate(taken)
        ]


def _shape(got: _Got, message_count: int, base64_only: bool, limit: int) -> dict[str, object]:
    """One message as RabbitMQ's get answers it."""
    message = ProtonMessage()
    message.decode(got.payload)
    body = message.body
    # A data section decodes as a memoryview, an amqp-value as what it holds.
    if isinstance(body, (bytes, bytearray, memoryview)):
        raw = bytes(body)
    else:
        raw = b"" if body is None else str(body).encode()
    shown = raw[:limit]
    text = None
    if not base64_only:
        try:
            text = shown.decode()
        except UnicodeDecodeError:
            text = None
    headers: Mapping[str, object] | None = message.properties
    properties: dict[str, object] = {"delivery_mode": 2 if message.durable else 1}
    for key, value in (
        ("content_type", message.content_type),
        ("content_encoding", message.content_encoding),
        ("correlation_id", message.correlation_id),
        ("message_id", message.id),
        ("reply_to", message.reply_to),
        ("type", message.subject),
    ):
        # proton 0.40 reads an absent content-type or content-encoding as symbol('None').
        if value is not None and str(value) != "None":
            properties[key] = str(value)
    if message.priority != DEFAULT_PRIORITY:
        properties["priority"] = message.priority
    if headers:
        properties["headers"] = {
            str(name): value if isinstance(value, (str, int, float, bool)) else str(value)
            for name, value in headers.items()
        }
    return {
        "payload_bytes": len(raw),
        "redelivered": got.redelivered,
        "exchange": got.exchange,
        "routing_key": got.routing_key,
        "message_count": message_count,
        "properties": properties,
        "payload": text if text is not None else base64.b64encode(shown).decode(),
        "payload_encoding": "string" if text is not None else "base64",
    }
