"""A base for the tests' placements (``Placement`` in queues/queue_homes.py): every queue lives
on this worker and no owner is asked anything, so that a test's placement says only what it
puts elsewhere."""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.queues.queue_homes import OwnerDeclared
from sluicegate.queues.queue_type import QueueType


class AllHere:
    """Every queue here: nothing remote, no change told, no owner's judgement."""

    def remote(self, name: str) -> QueueType | None:
        return None

    def changed(self, change: list[object]) -> None:
        pass

    def used(self, name: str) -> None:
        pass

    def owner_deletes(self, name: str) -> int | None:
        return None

    def owner_declares(
        self, name: str, arguments: Mapping[str, object], *, durable: bool, auto_delete: bool
    ) -> OwnerDeclared | None:
        return None

    def owner_declares_exchange(
        self,
        name: str,
        type_name: str,
        arguments: Mapping[str, object],
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
    ) -> OwnerDeclared | None:
        return None
