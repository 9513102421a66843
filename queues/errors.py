"""Errors of the pure queue layer, each carrying the AMQP condition that reports it (§2.8.15)."""

from __future__ import annotations

from typing import ClassVar


class QueueError(Exception):
    """A request the queue layer refuses; ``condition`` names the AMQP error to send."""

    condition: ClassVar[str] = "amqp:internal-error"


class DecodeError(QueueError):
    """A message section that is not valid AMQP encoding."""

    condition = "amqp:decode-error"


class MessageSizeExceeded(QueueError):
    """A message larger than the link's or the server's max-message-size."""

    condition = "amqp:link:message-size-exceeded"
