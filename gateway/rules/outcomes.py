"""The outcomes a consumer's source states in the ATTACH reply: those the server takes.

A consumer's source lists the outcomes its client may give (AMQP 1.0 §3.5.3, ``outcomes``). The
server settles a delivery by any of accepted, rejected, released and modified
(docs/queues.md), so, as RabbitMQ's session does, the reply states the client's list when every
outcome in it is one of those, all four when the client lists none, and an outcome outside them
refuses the link with ``amqp:not-implemented`` (a null terminus, then a DETACH): the client
learns at attach that an outcome it means to give would not be taken, not at its first
DISPOSITION. A single symbol is a list of one, as §1.6 allows for a multiple field.

Pure: tests/unit/gateway/rules/test_stated_outcomes.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sluicegate.queues.errors import NotImplementedByServer

# The descriptors' symbolic names of the four outcomes (§3.4), in the spec's order.
OUTCOMES: Final = (
    "amqp:accepted:list",
    "amqp:rejected:list",
    "amqp:released:list",
    "amqp:modified:list",
)

# The unsupported outcomes a refusal names: the first few tell the client what went wrong.
NAMED: Final = 3


def stated_outcomes(asked: Sequence[str] | None) -> tuple[str, ...]:
    """The outcomes the reply states for a client that listed ``asked`` (None: none listed);
    raises :class:`NotImplementedByServer` for one the server does not take."""
    if asked is None:
        return OUTCOMES
    # Each once: the reply must fit the client's frames, however often it named one.
    distinct = dict.fromkeys(asked)
    unsupported = [outcome for outcome in distinct if outcome not in OUTCOMES]
    if unsupported:
        named = ", ".join(unsupported[:NAMED])
        more = f" and {len(unsupported) - NAMED} more" if len(unsupported) > NAMED else ""
        raise NotImplementedByServer(
            f"outcomes not supported: {named}{more}; this server takes {', '.join(OUTCOMES)}"
        )
    return tuple(distinct)
