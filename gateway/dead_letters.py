"""Dead letters routed in batches within the memory budget, and the failures logged.

Their copies are stored within the memory budget's room (``MemoryBudget.room``: up to its
limit): a pass grows what it counts by at most that, the letters that do not fit waiting with
their messages held at their place, counted (queues/dead_lettering.py). The letters a
consumer's outcomes made are charged to its link, against its connection's dead-letter debt
(session/dead_letter_debt.py): as they wait or leave, the links that made them are held or let
go. A letter that cannot be dead-lettered is logged with what becomes of it: the server's
operator has no other way to learn of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import cast

from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.queue_type import Dispatch
from sluicegate.session.dead_letter_debt import DeadLetterDebt, LinkLetters
from sluicegate.session.memory_budget import MemoryBudget

log = logging.getLogger("sluicegate")


def route_dead_letters(
    vhosts: Iterable[VirtualHost],
    budget: MemoryBudget,
    held: HeldBytes,
    outbound: Callable[[], int],
    dispatch: Callable[[list[Dispatch]], None],
    hold: Callable[[DeadLetterDebt], None],
) -> bool:
    """Route a batch of every virtual host's pending dead letters, within what the memory
    budget has room for beside the queues' ``held`` bytes and the ``outbound`` ones. Returns
    whether letters are left past the batch (not those waiting for room): the expiry timer then
    comes back at the reactor's next pass rather than at its next interval."""
    left = False
    for vhost in vhosts:
        registry = vhost.registry
        if not registry.dead_letters:
            continue
        room = budget.room(held.total + outbound() + budget.unfinished)
        dispatch(registry.route_dead_letters(room))
        router = registry.dead_letter_router
        if router.toggled:
            # Only gateway/settling.py names causes, and they are links' shares of a debt.
            for debt in {cast(LinkLetters, cause).debt: None for cause in router.toggled}:
                hold(debt)
            router.toggled.clear()
        left = left or (bool(router.outbox) and not router.waiting)
        failures = router.failures
        for failure in failures:
            log.error(
                "dead-lettering %s of queue '%s' failed (%s): %s",
                failure.message,
                failure.queue,
                failure.error,
                "it stays at its place in its queue, not delivered, until the queue is "
                "purged or deleted or the server restarts"
                if failure.kept
                else "it is lost (purged, or refused at publish)",
            )
        failures.clear()
    return left
