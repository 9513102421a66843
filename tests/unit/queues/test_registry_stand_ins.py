"""A stand-in for a queue another worker owns takes its owner's declaration when the two
crossed (docs/workers.md, "Declarations are judged by the owner"); a queue that lives here
keeps its own."""

from __future__ import annotations

import pytest
from support.placement import AllHere

from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry


class _Elsewhere(AllHere):
    """A placement that puts the queues named ``far-...`` on another worker."""

    def __init__(self, owner: QueueRegistry) -> None:
        self.owner = owner
        self.changes: list[list[object]] = []

    def remote(self, name: str) -> QueueType | None:
        return self.owner.declare_queue(name) if name.startswith("far-") else None

    def changed(self, change: list[object]) -> None:
        self.changes.append(change)


def test_a_stand_in_takes_its_owners_declaration_and_judges_by_it() -> None:
    registry = QueueRegistry()
    registry.placement = _Elsewhere(QueueRegistry())
    # A link attached here declared it with the defaults.
    registry.declare("far-q")
    registry.take_declaration("far-q", {"x-max-length": 7}, durable=True, auto_delete=False)
    settings = registry.settings("far-q")
    assert dict(settings.raw_arguments) == {"x-max-length": 7}
    assert settings.arguments.max_length == 7
    # A redeclaration here is judged against the owner's, as on one worker.
    registry.declare_queue("far-q", {"x-max-length": 7})
    with pytest.raises(PreconditionFailed):
        registry.declare_queue("far-q")


def test_a_queue_that_lives_here_keeps_its_declaration() -> None:
    registry = QueueRegistry()
    registry.placement = _Elsewhere(QueueRegistry())
    registry.declare_queue("near-q", {"x-max-length": 3})
    with pytest.raises(PreconditionFailed, match="lives here"):
        registry.take_declaration("near-q", {}, durable=True, auto_delete=False)
    assert dict(registry.settings("near-q").raw_arguments) == {"x-max-length": 3}
