"""The one place an :class:`AmqpError` of the pure layers becomes proton's ``Condition``.

Everything below the shell (gateway/rules/, queues/, wire/) refuses by raising or returning an
``AmqpError``, whose class names the AMQP condition (§2.8.15); only the shell speaks proton.
"""

from __future__ import annotations

from typing import Final

from proton import Condition, Connection, Link, Session

from sluicegate.wire.errors import AmqpError

# The most bytes of a description sent: a CLOSE, END or DETACH cannot span frames, and a
# client may take frames as small as 512 bytes (AMQP 1.0 §2.7.1), while a description may name
# what the client sent (outcomes, addresses, a management reason). The rest is for the log.
MAX_DESCRIPTION: Final = 256
_CUT: Final = "..."


def condition(name: str, description: str) -> Condition:
    """An error condition whose description is at most :data:`MAX_DESCRIPTION` bytes."""
    encoded = description.encode()
    if len(encoded) > MAX_DESCRIPTION:
        kept = encoded[: MAX_DESCRIPTION - len(_CUT)].decode(errors="ignore")
        description = kept + _CUT
    return Condition(name, description)


def condition_of(error: AmqpError) -> Condition:
    """The error condition that reports ``error`` on a disposition or a closing endpoint."""
    return condition(error.condition, str(error))


def close(endpoint: Connection | Session | Link, error: AmqpError) -> None:
    """Close ``endpoint`` (CLOSE, END or DETACH) with the condition that reports ``error``."""
    endpoint.condition = condition_of(error)
    endpoint.close()
