"""Errors of the pure queue layer, each carrying the AMQP condition that reports it (§2.8.15)."""

from __future__ import annotations

from sluicegate.wire.errors import AmqpError


class QueueError(AmqpError):
    """A request the queue layer refuses; ``condition`` names the AMQP error to send."""


class PreconditionFailed(QueueError):
    """A declaration that conflicts with what exists, or a bad argument (RabbitMQ's 406/409)."""

    condition = "amqp:precondition-failed"


class NotFound(QueueError):
    """A queue or exchange that does not exist (RabbitMQ's 404)."""

    condition = "amqp:not-found"


class NotImplementedByServer(QueueError):
    """A feature RabbitMQ has that this server refuses rather than ignores."""

    condition = "amqp:not-implemented"


class ResourceLimitExceeded(QueueError):
    """A full queue refusing a message (``x-overflow = reject-publish``)."""

    condition = "amqp:resource-limit-exceeded"


class AccessRefused(QueueError):
    """Something the client may not do: touch what the server owns (the default and ``amq.*``
    exchanges), publish to an internal exchange, or act beyond its user's permissions."""

    condition = "amqp:unauthorized-access"


class ResourceLocked(QueueError):
    """An exclusive queue used by another connection (RabbitMQ's 405)."""

    condition = "amqp:resource-locked"


class InvalidFilter(QueueError):
    """A consumer filter that cannot be used: malformed, or beyond the limits checked at attach."""

    condition = "amqp:invalid-field"


class ResourceDeleted(QueueError):
    """A queue deleted under the links that used it (RabbitMQ detaches them with this)."""

    condition = "amqp:resource-deleted"
