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


class DeadLetterStrategy(enum.Enum):
    """How a quorum queue hands its dead letters over (``x-dead-letter-strategy``)."""

    AT_MOST_ONCE = "at-most-once"
    # The queue keeps a dead letter until its dead-letter queues have confirmed it.
    AT_LEAST_ONCE = "at-least-once"


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
    dead_letter_strategy: DeadLetterStrategy = DeadLetterStrategy.AT_MOST_ONCE
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
QUEUE_TYPES: set[str] = {"classic", "quorum", "stream"}
# The queue arguments each type takes: RabbitMQ 4.2's lists per type (its queue types'
# ``queue_arguments``), plus sluicegate's own ``x-delivery-limit`` on classic queues and
# ``x-consumer-timeout``. An argument one type takes is refused for another, as RabbitMQ
# refuses it ("invalid arg 'x-max-age' for queue type classic"); an argument no type takes is
# kept and ignored, as in RabbitMQ.
_TYPE_ARGUMENTS: Final[dict[str, frozenset[str]]] = {
    "classic": frozenset(
        {
            "x-expires",
            "x-message-ttl",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-priority",
            "x-overflow",
            "x-queue-mode",
            "x-queue-version",
            "x-single-active-consumer",
            "x-queue-master-locator",
            "x-queue-leader-locator",
            "x-delivery-limit",
            "x-consumer-timeout",
        }
    ),
    "quorum": frozenset(
        {
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-dead-letter-strategy",
            "x-expires",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-in-memory-length",
            "x-max-in-memory-bytes",
            "x-overflow",
            "x-single-active-consumer",
            "x-quorum-initial-group-size",
            "x-quorum-target-group-size",
            "x-delivery-limit",
            "x-message-ttl",
            "x-queue-leader-locator",
            "x-consumer-timeout",
        }
    ),
    "stream": frozenset(
        {
            "x-max-length-bytes",
            "x-max-age",
            "x-stream-max-segment-size-bytes",
            "x-stream-filter-size-bytes",
            "x-initial-cluster-size",
            "x-queue-leader-locator",
        }
    ),
}
_KNOWN: Final = frozenset().union(*_TYPE_ARGUMENTS.values())
# Arguments RabbitMQ knows that this server refuses rather than ignores silently.
_REFUSED: Final = {
    "x-queue-mode": "lazy mode does not apply: classic queues keep messages in memory",
}
# RabbitMQ's leader locators: accepted for compatibility, meaningless on one node.
_LEADER_LOCATORS: Final = frozenset(
    {"client-local", "balanced", "random", "least-leaders", "min-masters"}
)
# A stream's per-chunk filter size in bytes: RabbitMQ takes 16 to 255.
_FILTER_SIZE_RANGE: Final = range(16, 256)


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


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PreconditionFailed(f"invalid arg '{name}': expected a positive integer")
    return value


def _choice(name: str, value: object, choices: type[enum.Enum]) -> enum.Enum:
    try:
        return choices(_string(name, value))
    except ValueError:
        allowed = ", ".join(str(c.value) for c in choices)
        raise PreconditionFailed(
            f"invalid arg '{name}': {value!r} is not one of {allowed}"
        ) from None


def _queue_type(arguments: Mapping[str, object]) -> str:
    """The declared ``x-queue-type`` (classic by default), refused if not served."""
    value = arguments.get("x-queue-type", "classic")
    kind = _string("x-queue-type", value)
    if kind not in QUEUE_TYPES:
        raise NotImplementedByServer(f"invalid arg 'x-queue-type': queue type {kind!r}")
    return kind


def parse_arguments(arguments: Mapping[str, object] | None) -> QueueArguments:
    """Validate a declaration's arguments; raise naming the first bad one."""
    if not arguments:
        return DEFAULT_ARGUMENTS
    kind = _queue_type(arguments)
    accepted = _TYPE_ARGUMENTS[kind]
    values: dict[str, object] = {"queue_type": kind}
    extra: list[tuple[str, object]] = []
    for name in sorted(arguments):
        value = arguments[name]
        if name in _KNOWN and name not in accepted:
            raise PreconditionFailed(f"invalid arg '{name}' for queue type {kind}")
        if name == "x-queue-type":
            continue
        if name == "x-message-ttl":
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
            values["dead_letter_strategy"] = _choice(name, value, DeadLetterStrategy)
        elif name == "x-max-length":
            values["max_length"] = _non_negative(name, value)
        elif name == "x-max-length-bytes":
            values["max_length_bytes"] = _non_negative(name, value)
        elif name == "x-overflow":
            values["overflow"] = _choice(name, value, Overflow)
        elif name == "x-delivery-limit":
            values["delivery_limit"] = _delivery_limit(kind, value)
        elif name == "x-single-active-consumer":
            values["single_active_consumer"] = _boolean(name, value)
        elif name == "x-consumer-timeout":
            timeout = _non_negative(name, value)
            values["consumer_timeout"] = timeout or None
        elif name == "x-queue-mode" and value == "default":
            # What every queue here does: kept and ignored, as RabbitMQ 4 keeps it.
            extra.append((name, value))
        elif name == "x-queue-mode" and value != "lazy":
            raise PreconditionFailed(
                f"invalid arg 'x-queue-mode': {value!r} is neither 'default' nor 'lazy'"
            )
        elif name in _REFUSED:
            raise NotImplementedByServer(f"invalid arg '{name}': {_REFUSED[name]}")
        else:
            # An argument no queue type knows is kept and ignored, as RabbitMQ does: its
            # Python client sends x-deliver-limit for a quorum queue's delivery limit.
            _check_passed_through(name, value)
            extra.append((name, value))
    if "dead_letter_routing_key" in values and "dead_letter_exchange" not in values:
        raise PreconditionFailed(
            "invalid arg 'x-dead-letter-routing-key': needs x-dead-letter-exchange"
        )
    if kind == "quorum":
        _quorum_defaults(values)
    return QueueArguments(extra=tuple(extra), **values)  # type: ignore[arg-type]


def _check_passed_through(name: str, value: object) -> None:
    """Validate the arguments a queue type keeps in ``extra`` (RabbitMQ's checks)."""
    if name in _POSITIVE:
        _positive(name, value)
    elif name in _NON_NEGATIVE:
        _non_negative(name, value)
    elif name == "x-stream-filter-size-bytes":
        size = _non_negative(name, value)
        if size not in _FILTER_SIZE_RANGE:
            raise PreconditionFailed(
                f"invalid arg '{name}': expected {_FILTER_SIZE_RANGE.start} to "
                f"{_FILTER_SIZE_RANGE.stop - 1} bytes, got {size}"
            )
    elif name in _LOCATORS and _string(name, value) not in _LEADER_LOCATORS:
        raise PreconditionFailed(f"invalid arg '{name}': unknown locator {value!r}")


_POSITIVE: Final = frozenset(
    {"x-quorum-initial-group-size", "x-quorum-target-group-size", "x-initial-cluster-size"}
)
_NON_NEGATIVE: Final = frozenset(
    {"x-max-in-memory-length", "x-max-in-memory-bytes", "x-stream-max-segment-size-bytes"}
)
_LOCATORS: Final = frozenset({"x-queue-leader-locator", "x-queue-master-locator"})


def _delivery_limit(kind: str, value: object) -> int | None:
    """A quorum queue's negative limit means none (RabbitMQ 4); classic ones are non-negative."""
    if kind == "quorum":
        if isinstance(value, bool) or not isinstance(value, int):
            raise PreconditionFailed("invalid arg 'x-delivery-limit': expected an integer")
        return None if value < 0 else value
    return _non_negative("x-delivery-limit", value)


# RabbitMQ 4's quorum queues give up on a message after this many failed deliveries unless
# x-delivery-limit says otherwise (a negative limit: never).
QUORUM_DELIVERY_LIMIT: Final = 20


def _quorum_defaults(values: dict[str, object]) -> None:
    """RabbitMQ 4.2's quorum rules: a delivery limit by default, and the overflow and
    dead-letter strategies a quorum queue has.

    ``reject-publish-dlx`` is accepted and means ``drop-head``; ``at-least-once`` holds only
    with ``reject-publish`` overflow and a dead-letter exchange, and falls back to
    ``at-most-once`` otherwise (RabbitMQ logs a warning in both cases).
    """
    values.setdefault("delivery_limit", QUORUM_DELIVERY_LIMIT)
    if values.get("overflow") is Overflow.REJECT_PUBLISH_DLX:
        values["overflow"] = Overflow.DROP_HEAD
    if values.get("dead_letter_strategy") is DeadLetterStrategy.AT_LEAST_ONCE and (
        values.get("overflow") is not Overflow.REJECT_PUBLISH
        or "dead_letter_exchange" not in values
    ):
        values["dead_letter_strategy"] = DeadLetterStrategy.AT_MOST_ONCE


def check_properties(queue_type: str, *, durable: bool, exclusive: bool, auto_delete: bool) -> None:
    """Quorum queues and streams are durable, shared and kept: RabbitMQ refuses the rest."""
    if queue_type == "classic":
        return
    refusals = (
        (auto_delete, "auto-delete"),
        (exclusive, "exclusive"),
        (not durable, "non-durable"),
    )
    for refused, name in refusals:
        if refused:
            raise PreconditionFailed(f"invalid property '{name}' for queue type {queue_type}")
