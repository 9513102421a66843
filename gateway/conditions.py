"""The one place an :class:`AmqpError` of the pure layers becomes proton's ``Condition``.

Everything below the shell (gateway/rules/, queues/, wire/) refuses by raising or returning an
``AmqpError``, whose class names the AMQP condition (§2.8.15); only the shell speaks proton.
"""

from __future__ import annotations

from proton import Condition, Connection, Link, Session

from sluicegate.wire.errors import AmqpError


def condition_of(error: AmqpError) -> Condition:
    """The error condition that reports ``error`` on a disposition or a closing endpoint."""
    return Condition(error.condition, str(error))


def close(endpoint: Connection | Session | Link, error: AmqpError) -> None:
    """Close ``endpoint`` (CLOSE, END or DETACH) with the condition that reports ``error``."""
    endpoint.condition = Condition(error.condition, str(error))
    endpoint.close()
