"""Reading the deaths a dead-lettered message carries, as a client of RabbitMQ 4 would."""

from __future__ import annotations

from sluicegate.wire.amqp_types import Value
from sluicegate.wire.deaths import DEATHS
from sluicegate.wire.sections import MESSAGE_ANNOTATIONS, sections


def deaths_of(payload: bytes) -> list[dict[Value, Value]]:
    """The ``x-opt-deaths`` entries a message carries, most recent first."""
    for code, value, _, _ in sections(payload, until=MESSAGE_ANNOTATIONS + 1):
        if code == MESSAGE_ANNOTATIONS and isinstance(value, dict):
            recorded = value.get(DEATHS)
            if isinstance(recorded, list):
                return [entry for entry in recorded if isinstance(entry, dict)]
    return []
