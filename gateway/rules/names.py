"""Names a client may give a queue or an exchange.

RabbitMQ refuses carriage returns and line feeds in names (its logs and HTTP API would break on
them); sluicegate refuses NUL too, which the durable log uses to qualify a name by its virtual
host (gateway/rules/vhost_log.py).
"""

from __future__ import annotations

from typing import Final

from sluicegate.queues.errors import QueueError

_FORBIDDEN: Final = ("\r", "\n", "\x00")


class BadName(QueueError):
    """A queue or exchange name with a character it may not have."""

    condition = "amqp:invalid-field"


def check_name(kind: str, name: str) -> None:
    """Raise :class:`BadName` for a name with a carriage return, line feed or NUL."""
    if any(character in name for character in _FORBIDDEN):
        raise BadName(
            f"Bad {kind} name {name!r}: line feed, carriage return and NUL characters not allowed"
        )
