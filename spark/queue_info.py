"""What the gateway says about the queue a read names, asked before anything is taken from it.

Every read looks the queue up over the gateway's management API (``GET /queues/NAME``, RabbitMQ
4's HTTP-over-AMQP) before it attaches a receiver: a missing queue is an error naming it (a
receiver's ATTACH would declare it), and a queue of the wrong type is refused before a single
message is received. For a stream the same reply gives its first offset and the offset its next
message will get, so planning needs no receiver at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluicegate.clients.management import path_segment
from sluicegate.spark.amqp import AmqpConnection, AmqpError
from sluicegate.spark.options import Mode, OptionError, ReadOptions
from sluicegate.wire.addresses import AddressError, AddressNotImplemented, parse_address

STREAM: Final = "stream"
_NOT_FOUND: Final = 404


class MissingQueue(AmqpError):
    """The queue a read names does not exist (and ``failOnMissing`` is true)."""


class WrongQueueType(AmqpError):
    """The queue is not of the type the read mode needs; nothing was taken from it."""


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue's type and, for a stream, where it starts and where its next message goes."""

    name: str
    type: str
    message_count: int
    # Streams only: the first offset held (None when empty) and the next offset to be written.
    first_offset: int | None = None
    next_offset: int | None = None

    @property
    def first(self) -> int:
        """The stream's first offset still held; its next offset when it is empty."""
        if self.first_offset is not None:
            return self.first_offset
        return self.tail

    @property
    def tail(self) -> int:
        """The offset the stream's next message will get."""
        if self.next_offset is None:
            raise AmqpError(f"queue '{self.name}' reports no stream offsets")
        return self.next_offset


def queue_name(address: str) -> str:
    """The queue an address names (``/queues/NAME``, a bare name, ...)."""
    try:
        return parse_address(address).queue
    except (AddressError, AddressNotImplemented) as error:
        raise OptionError(f"option address: {error}") from None


def look_up(amqp: AmqpConnection, options: ReadOptions) -> QueueInfo | None:
    """The queue of ``options.endpoint.address``, or None if it does not exist.

    Raises :class:`MissingQueue` for a missing queue when ``failOnMissing`` is true, and
    :class:`WrongQueueType` when the mode does not fit the queue's type.
    """
    endpoint = options.endpoint
    name = queue_name(endpoint.address)
    reply = amqp.request("GET", f"/queues/{path_segment(name)}", endpoint.connect_timeout_s)
    if reply.status == _NOT_FOUND:
        if options.fail_on_missing:
            raise MissingQueue(
                f"{endpoint.url}: queue '{name}' does not exist (address {endpoint.address}); "
                "a read never declares a queue: declare it, or set failOnMissing=false to read "
                "it as empty until it appears"
            )
        return None
    body = reply.body
    if not reply.ok or not isinstance(body, dict):
        raise AmqpError(f"{endpoint.url}: looking up queue '{name}' failed: {reply.status} {body}")
    info = QueueInfo(
        name=name,
        type=str(body.get("type", "classic")),
        message_count=int(body.get("message_count", 0)),
        first_offset=_offset(body.get("first_offset")),
        next_offset=_offset(body.get("next_offset")),
    )
    _check_type(info, options.mode)
    return info


def batch_end(
    amqp: AmqpConnection, options: ReadOptions, start: int, stop: int, max_bytes: int
) -> int:
    """Where a ``maxBytesPerTrigger`` batch from ``start`` ends: by ``stop``, within
    ``max_bytes`` but for a first message larger alone, as the gateway sums the stream's sizes
    (``GET /queues/{q}/byte-range``, docs/management.md); asked again while it answers in parts.
    """
    endpoint = options.endpoint
    name = queue_name(endpoint.address)
    at, left, first = int(start), int(max_bytes), True
    while True:
        path = (
            f"/queues/{path_segment(name)}/byte-range?start={at}&stop={int(stop)}&max_bytes={left}"
            + ("&at_least_one=true" if first else "")
        )
        reply = amqp.request("GET", path, endpoint.connect_timeout_s)
        body = reply.body
        if not reply.ok or not isinstance(body, dict):
            raise AmqpError(
                f"{endpoint.url}: sizing a batch of stream '{name}' from offset {start} failed: "
                f"{reply.status} {body}"
            )
        end, used = _offset(body.get("end")), _offset(body.get("bytes"))
        if end is None or used is None or end < at:
            raise AmqpError(f"{endpoint.url}: a malformed byte-range reply: {body}")
        if body.get("capped") is not True or end >= stop or end == at:
            return int(max(end, start))
        at, left, first = int(end), left - int(used), False


def _offset(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_type(info: QueueInfo, mode: Mode) -> None:
    if mode is Mode.STREAM and info.type != STREAM:
        raise WrongQueueType(
            f"queue '{info.name}' is a {info.type} queue, not a stream: mode=stream reads "
            "stream queues by offset; read this queue with mode=queue (streaming) or "
            "mode=browse (batch)"
        )
    if mode is not Mode.STREAM and info.type == STREAM:
        raise WrongQueueType(
            f"queue '{info.name}' is a stream queue: read it with mode=stream (offsets), "
            f"not mode={mode.value}"
        )
