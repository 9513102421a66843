"""The queues' clock and their deadlines, driven by the reactor.

Queues never read the time: the server sets the registry's :class:`~queues.queue_type.Clock`
once per pass of the event loop (:func:`tick`), and a reactor timer runs the queues' due
expiries and lock releases every :data:`EXPIRY_INTERVAL`, and deletes the queues left unused
for their ``x-expires``. Work a queue left for later (a filtered stream read that used its
budget) is due at once: the timer then fires again at the next pass of the reactor, after the
events of other clients, rather than an interval later. A delivery checks expiry itself, so the
interval only bounds how late an expired message reaches its dead-letter queue, or how late an
unused queue goes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from proton import Event, Handler
from proton.reactor import Container

from sluicegate.gateway.proton.internals import Task
from sluicegate.gateway.rare_warning import CLIENT_BURST, RareWarning
from sluicegate.queues.queue_type import Dispatch
from sluicegate.queues.registry import QueueRegistry

log = logging.getLogger("sluicegate")
# Queues a client declares with a short x-expires, over and over, each a line within the burst
# of its kind (gateway/rare_warning.py).
_expired = RareWarning(
    "queue deleted, unused for its x-expires", burst=CLIENT_BURST, level=logging.INFO
)

# How often due deadlines are acted on: a dead letter arrives at most this late, and an idle
# server wakes 20 times a second for it, which costs nothing measurable.
EXPIRY_INTERVAL: Final = 0.05


def tick(registry: QueueRegistry) -> None:
    """Set the queues' clock to now, in milliseconds since the epoch (AMQP's timestamp unit)."""
    registry.clock.now = time.time_ns() // 1_000_000


class ExpiryTimer(Handler):
    """Runs the registries' due deadlines every interval and routes what they release.

    ``registries`` are those of every virtual host; they share one clock. ``deleted`` is told
    of each queue deleted for being unused (x-expires), so the links still attached to it
    (publishers) are detached as for any deleted queue.
    """

    def __init__(
        self,
        registries: list[QueueRegistry],
        route: Callable[[list[Dispatch]], None],
        deleted: Callable[[QueueRegistry, str], None],
    ) -> None:
        super().__init__()
        self.registries = registries
        self._route = route
        self._deleted = deleted
        self._container: Container | None = None
        self._task: Task | None = None
        # Armed to fire at the next pass (:meth:`soon`).
        self._hurried = False

    def start(self, container: Container) -> None:
        """Arm the first timer; the queues' x-expires countdowns start now."""
        for registry in self.registries:
            registry.start_expiry_clocks()
        self._container = container
        self._task = container.schedule(EXPIRY_INTERVAL, self)

    def stop(self) -> None:
        """Disarm, so that the reactor can finish at shutdown."""
        self._container = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def soon(self) -> None:
        """Fire at the next pass of the reactor, not an interval later: work is left over
        (dead letters past a pass's batch)."""
        container = self._container
        if container is None or self._hurried:
            return
        if self._task is not None:
            self._task.cancel()
        self._hurried = True
        self._task = container.schedule(0.0, self)

    def on_timer_task(self, event: Event) -> None:
        """Expire what is due, then re-arm, whatever happened.

        A failure (a bug in one queue's expiry, say) is logged and the timer goes on: left
        disarmed, no TTL, x-expires, consumer timeout or dead-letter retry would ever run again.
        """
        # This task has fired: nothing is armed until :meth:`soon` or :meth:`_rearm` arms one.
        self._task = None
        self._hurried = False
        try:
            self._expire()
        except Exception:
            log.exception("internal error in the expiry timer; it goes on")
        finally:
            self._rearm()

    def _expire(self) -> None:
        tick(self.registries[0])
        for registry in self.registries:
            dispatches = registry.expire()
            if dispatches:
                self._route(dispatches)
            for name in registry.expire_unused():
                _expired.happened(time.monotonic(), f"'{name}'")
                self._deleted(registry, name)

    def _rearm(self) -> None:
        container = self._container
        if container is None or self._task is not None:
            return  # stopped, or armed by :meth:`soon` meanwhile: one task at a time
        now = self.registries[0].clock.now
        due = any(
            deadline is not None and deadline <= now
            for deadline in (registry.next_deadline() for registry in self.registries)
        )
        self._task = container.schedule(0.0 if due else EXPIRY_INTERVAL, self)
