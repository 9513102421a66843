"""Errors that carry the AMQP condition reporting them (AMQP 1.0 §2.8.15).

:class:`AmqpError` is the root of every error the server's pure layers raise, so the gateway
closes the right endpoint with ``error.condition`` whichever layer refused: the wire format
here, the queues above it.
"""

from __future__ import annotations

from typing import ClassVar


class AmqpError(Exception):
    """A request refused; ``condition`` names the AMQP error to send."""

    condition: ClassVar[str] = "amqp:internal-error"


class DecodeError(AmqpError):
    """A message section that is not valid AMQP encoding."""

    condition = "amqp:decode-error"


class MessageSizeExceeded(AmqpError):
    """A message (or a request on a management link) larger than the link accepts."""

    condition = "amqp:link:message-size-exceeded"


class EncodeError(ValueError):
    """A value no AMQP type holds (an integer beyond 64 bits, a type with no counterpart)."""
