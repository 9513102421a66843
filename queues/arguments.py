"""Queue arguments: RabbitMQ's ``x-*`` names, parsed and validated in one place.

A declaration names its queue's behaviour with RabbitMQ's optional arguments (its queue
arguments table). Every argument is checked here once, so a bad one is refused at declaration
with a :class:`~queues.errors.PreconditionFailed` naming it, and the queue itself only ever
sees a well-formed :class:`QueueArguments`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sluicegate.queues.errors import NotImplementedByServer, PreconditionFailed


class Overflow(enum.Enum):
    """What a full queue does with the next message (RabbitMQ's ``x-overflow``)."""

    DROP_HEAD = "drop-head"
    REJECT_PUBLISH = "reject-publish"
    REJECT_PUBLISH_DLX = "reject-publish-dlx"


@dataclass(frozen=True, slots=True)
class QueueArguments:
    """A queue's validated arguments; ``None`` means the argument is absent (no limit)."""

    queue_type: str = "classic"
    message_ttl: int | None = None
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = Overflow.DROP_HEAD
    delivery_limit: int | None = None
    single_active_consumer: bool = False
    # How long a consumer may hold a delivery unsettled before it is released (milliseconds).
    consumer_timeout: int | None = None
    # How long the queue may stay unused before it is deleted (milliseconds, RabbitMQ's
    # x-expires); the registry keeps the countdown.
    expires: int | None = None
    # The highest message priority a classic queue tells apart (x-max-priority); None: FIFO.
    max_priority: int | None = None
    # Arguments this queue type does not interpret itself (a stream's retention, say).
    extra: tuple[tuple[str, object], ...] = ()

    @property
    def bounded(self) -> bool:
        """True when the queue has a length limit."""
        return self.max_length is not None or self.max_length_bytes is not None


DEFAULT_ARGUMENTS: Final = QueueArguments()

# The queue types this server serves (their factories are in queues.registry).
QUEUE_TYPES: set[str] = {"classic", "stream"}
# Arguments of other queue types that a classic queue accepts and ignores, as RabbitMQ does.
_PASSED_THROUGH: Final = frozenset(
    {
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
        "x-queue-version",
    }
)
# Arguments RabbitMQ knows that this server refuses rather than ignores silently.
_REFUSED: Final = {
    "x-queue-mode": "lazy mode does not apply: classic queues keep messages in memory",
    "x-quorum-initial-group-size": "quorum queues are not supported",
}
_DEAD_LETTER_STRATEGIES: Final = frozenset({"at-most-once"})
# The longest x-expires RabbitMQ takes (its timers' limit, about 49.7 days); longer is refused.
MAX_EXPIRES: Final = 2**32 - 1


def _non_negative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PreconditionFailed(f"invalid arg '{name}': expected a non-negative integer")
    return value


def _expiry(name: str, value: object) -> int:
    """A queue's x-expires: unlike a message TTL it cannot be 0, as in RabbitMQ."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_EXPIRES:
        raise PreconditionFailed(
            f"invalid arg '{name}': expected a positive integer of milliseconds, "
            f"at most {MAX_EXPIRES}, got {value!r}"
        )
    return value


def _string(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise PreconditionFailed(f"invalid arg '{name}': expected a string")
    return value


def _boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise PreconditionFailed(f"invalid arg '{name}': expected a boolean")
    return value


def parse_arguments(arguments: Mapping[str, object] | None) -> QueueArguments:
    """Validate a declaration's arguments; raise naming the first bad one."""
    if not arguments:
        return DEFAULT_ARGUMENTS
    values: dict[str, object] = {}
    extra: list[tuple[str, object]] = []
    for name in sorted(arguments):
        value = arguments[name]
        if name == "x-queue-type":
            kind = _string(name, value)
            if kind not in QUEUE_TYPES:
                raise NotImplementedByServer(f"invalid arg '{name}': queue type {kind!r}")
            values["queue_type"] = kind
        elif name == "x-message-ttl":
            values["message_ttl"] = _non_negative(name, value)
        elif name == "x-expires":
            values["expires"] = _expiry(name, value)
        elif name == "x-max-priority":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 255:
                raise PreconditionFailed(
                    f"invalid arg '{name}': expected an integer from 1 to 255, got {value!r}"
                )
            values["max_priority"] = value
        elif name == "x-dead-letter-exchange":
            values["dead_letter_exchange"] = _string(name, value)
        elif name == "x-dead-letter-routing-key":
            values["dead_letter_routing_key"] = _string(name, value)
        elif name == "x-dead-letter-strategy":
            if value not in _DEAD_LETTER_STRATEGIES:
                raise PreconditionFailed(f"invalid arg '{name}': only at-most-once is served")
        elif name == "x-max-length":
            values["max_length"] = _non_negative(name, value)
        elif name == "x-max-length-bytes":
            values["max_length_bytes"] = _non_negative(name, value)
        elif name == "x-overflow":
            try:
                values["overflow"] = Overflow(_string(name, value))
            except ValueError:
                choices = ", ".join(o.value for o in Overflow)
                raise PreconditionFailed(
                    f"invalid arg '{name}': {value!r} is not one of {choices}"
                ) from None
        elif name == "x-delivery-limit":
            values["delivery_limit"] = _non_negative(name, value)
        elif name == "x-single-active-consumer":
            values["single_active_consumer"] = _boolean(name, value)
        elif name == "x-consumer-timeout":
            timeout = _non_negative(name, value)
            values["consumer_timeout"] = timeout or None
        elif name in _REFUSED:
            raise NotImplementedByServer(f"invalid arg '{name}': {_REFUSED[name]}")
        elif name in _PASSED_THROUGH or not name.startswith("x-"):
            extra.append((name, value))
        else:
            raise PreconditionFailed(f"invalid arg '{name}': unknown queue argument")
    if "dead_letter_routing_key" in values and "dead_letter_exchange" not in values:
        raise PreconditionFailed(
            "invalid arg 'x-dead-letter-routing-key': needs x-dead-letter-exchange"
        )
    if values.get("queue_type") == "stream" and "expires" in values:
        # Streams do not expire: RabbitMQ refuses the argument for the stream queue type.
        raise PreconditionFailed("invalid arg 'x-expires' for queue type stream")
    if values.get("queue_type") == "stream" and "max_priority" in values:
        raise PreconditionFailed("invalid arg 'x-max-priority' for queue type stream")
    return QueueArguments(extra=tuple(extra), **values)  # type: ignore[arg-type]
