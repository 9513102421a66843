"""The links attached to each queue, so that deleting a queue looks at its own links only.

A deleted queue's consumers and publishers are detached with ``amqp:resource-deleted``. Found by
a walk over every session and publisher of the server, each deletion cost as much as the server
held: a client attaching and detaching dynamic links (each detach deletes a temporary queue), or
deleting queues over management, made the reactor walk every other client's links each time.
"""

from __future__ import annotations

from collections.abc import Hashable

from proton import Link

from sluicegate.queues.registry import QueueRegistry

# A queue by its virtual host's registry and its name: a queue deleted and declared again under
# the same name is the same key, as a deletion's detaches have always been by name.
QueueKey = tuple[QueueRegistry, str]


class QueueLinks:
    """Consumer and publisher links by the queue they are attached to.

    Each link is kept under a key of the caller's (a consumer's pure link, a publisher's state):
    proton hands out a new wrapper for the same link at each event, so wrappers are no keys.
    Consumers are counted apart: an auto-delete queue goes when its last one leaves, which a
    queue's statistics would tell only by a walk over its consumers and what they hold.
    """

    __slots__ = ("_consumers", "_publishers")

    def __init__(self) -> None:
        self._consumers: dict[QueueKey, dict[Hashable, Link]] = {}
        self._publishers: dict[QueueKey, dict[Hashable, Link]] = {}

    def add(self, registry: QueueRegistry, name: str, key: Hashable, link: Link) -> None:
        """``link``, known by ``key``, is attached to queue ``name`` of ``registry``."""
        links = self._consumers if link.is_sender else self._publishers
        links.setdefault((registry, name), {})[key] = link

    def discard(self, registry: QueueRegistry, name: str, key: Hashable) -> None:
        """The link known by ``key`` left queue ``name`` (a no-op if it was taken already)."""
        for links in (self._consumers, self._publishers):
            of_queue = links.get((registry, name))
            if of_queue is not None and of_queue.pop(key, None) is not None:
                if not of_queue:
                    del links[registry, name]
                return

    def consumers(self, registry: QueueRegistry, name: str) -> int:
        """How many consumers queue ``name`` has."""
        return len(self._consumers.get((registry, name), ()))

    def take(self, registry: QueueRegistry, name: str) -> list[Link]:
        """Every link of queue ``name``, which is deleted, consumers first: none is kept."""
        key = (registry, name)
        consumers = self._consumers.pop(key, {})
        publishers = self._publishers.pop(key, {})
        return [*consumers.values(), *publishers.values()]

    def __len__(self) -> int:
        """Queues with consumers plus queues with publishers: 0 once every client has left."""
        return len(self._consumers) + len(self._publishers)
