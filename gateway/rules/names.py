"""Names a client may give a queue or an exchange.

RabbitMQ refuses carriage returns and line feeds in names (its logs and HTTP API would break on
them); sluicegate refuses NUL too, which the durable log uses to qualify a name by its virtual
host (gateway/rules/vhost_log.py). A name is at most 255 bytes, RabbitMQ's limit (AMQP 0-9-1's
short string): a queue's name is repeated in the log record of each of its messages and in each
frame that crosses between workers (docs/bounds.md), so it must not be 64 KiB.
"""

from __future__ import annotations

from typing import Final

from sluicegate.queues.errors import QueueError

_FORBIDDEN: Final = ("\r", "\n", "\x00")
MAX_NAME_BYTES: Final = 255


class BadName(QueueError):
    """A queue or exchange name with a character it may not have."""

    condition = "amqp:invalid-field"


def check_name(kind: str, name: str) -> None:
    """Raise :class:`BadName` for a name with a carriage return, line feed or NUL, or longer
    than :data:`MAX_NAME_BYTES` (a name of 63 characters or fewer cannot be)."""
    if len(name) > MAX_NAME_BYTES // 4 and len(name.encode()) > MAX_NAME_BYTES:
        raise BadName(f"Bad {kind} name: longer than {MAX_NAME_BYTES} bytes")
    if any(character in name for character in _FORBIDDEN):
        raise BadName(
            f"Bad {kind} name {name!r}: line feed, carriage return and NUL characters not allowed"
        )
