"""What the console shows of the flow-control loops, read on the reactor thread (docs/console.md).

Every pure part already counts what it owns (``statistics()`` on writers, sessions, links,
accounts and the budget); this module reads those records for one connection, or for the
budget's holders, and says in words which loop holds a link (docs/design.md names the loops).
Nothing here runs per message: a read is one job on the reactor (gateway/http/reactor_calls.py)
at most once per interval (gateway/http/snapshot_cache.py), and each reply is capped: a page of
links, the first sessions, the heaviest queues and connections.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Iterable
from dataclasses import asdict
from typing import Final, TypeVar

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.state import ConnectionState, IncomingLinkState, OutgoingLinkState
from sluicegate.session.outbound import SessionStatistics

T = TypeVar("T")

# Links of each kind (consumers, publishers) in one reply: a connection may have 64 sessions of
# 256 links; a hundred rows is what a page shows and a few milliseconds of the reactor.
LINKS_PAGE: Final = 100
# Sessions listed for a connection: RabbitMQ 4's 64 channels, and a margin for a larger
# channel_max (the count is given whole).
MAX_SESSIONS_SHOWN: Final = 128
# Queues per virtual host and connections named as the budget's heaviest holders, and held
# publishers and paused connections listed: what a person reads, not a listing.
TOP_HOLDERS: Final = 10
MAX_HELD_SHOWN: Final = 50
# Queues read per turn of the reactor while weighing holders (as gateway/statistics.py does).
SLICE: Final = 500


def sees_everything(broker: Broker, user: User) -> bool:
    """RabbitMQ's administrator: a user with that tag, or anyone on a server without users."""
    return not broker.config.users or "administrator" in user.tags


def visible(broker: Broker, user: User, connection_user: str) -> bool:
    """Whether ``user`` may see a connection of ``connection_user`` (its own, or an admin)."""
    return sees_everything(broker, user) or connection_user == user.name


# -- one connection ---------------------------------------------------------------------------


def connection_loops(broker: Broker, name: str, page: int) -> dict[str, object] | None:
    """Every loop of the connection named ``name``, its links' ``page``; None: no such one."""
    state = next((c for c in broker.connections if c.name == name and not c.closed), None)
    if state is None or state.user is None or state.vhost is None:
        return None
    budget = broker.publishing.budget.statistics()
    sessions = list(state.sessions.values())
    session_stats = [session.pure.statistics() for session in sessions[:MAX_SESSIONS_SHOWN]]
    index = {id(session): number for number, session in enumerate(sessions)}
    consumers = sorted(
        (sender for session in sessions for sender in session.senders.values()),
        key=lambda sender: (index[id(sender.session)], sender.link.handle),
    )
    publishers = sorted(state.publishers, key=lambda publisher: publisher.receiver.name)
    start = (page - 1) * LINKS_PAGE
    return {
        "name": state.name,
        "user": state.user.name,
        "vhost": state.vhost.name,
        "reads_paused": state.reads_paused,
        "paused_because": _paused_because(broker, state),
        "writer": asdict(state.writer.statistics()),
        "account": asdict(state.account.statistics()),
        "waiting": asdict(state.waiting.statistics()),
        "budget": {"used": budget.used, "limit": budget.limit, "blocked": budget.blocked},
        "session_count": len(sessions),
        "sessions": [
            {"number": number, **asdict(stats), "held_by": _session_held_by(stats)}
            for number, stats in enumerate(session_stats)
        ],
        "page": page,
        "page_size": LINKS_PAGE,
        "consumer_count": len(consumers),
        "consumers": [
            _consumer(sender, index, session_stats)
            for sender in consumers[start : start + LINKS_PAGE]
        ],
        "publisher_count": len(publishers),
        "publishers": [_publisher(broker, p) for p in publishers[start : start + LINKS_PAGE]],
    }


def _paused_because(broker: Broker, state: ConnectionState) -> list[str]:
    """Why the connection's socket is not read, in words (empty: it is read)."""
    reasons = []
    account = state.account
    if account.paused:
        reasons.append(
            f"account: {account.debt} routed copies not yet stored reached its limit of "
            f"{account.limit}; reads resume at {account.resume_at}"
        )
    inbound = state.inbound
    if inbound is not None and inbound.budget_paused:
        budget = broker.publishing.budget
        if inbound.unfinished and broker.publishing.flow.unfinished_full:
            reasons.append(
                "memory budget: the server's cap on bytes of deliveries still arriving is "
                "full, and this connection has one arriving"
            )
        else:
            reasons.append(
                f"memory budget: {budget.used} of {budget.limit} bytes held, and this "
                "connection's publishers send to the queues that hold it"
            )
    return reasons


def _session_held_by(stats: SessionStatistics) -> str | None:
    """The session-wide loop that stops its transfers, if one does."""
    if stats.writer_blocked:
        return "writer credit: the socket has not taken the frames already handed to it"
    if stats.remote_incoming_window <= 0 and stats.outgoing_pending:
        return "session window: the client's incoming window is full"
    return None


def _consumer(
    sender: OutgoingLinkState, index: dict[int, int], sessions: list[SessionStatistics]
) -> dict[str, object]:
    link = sender.link
    stats = link.statistics()
    number = index[id(sender.session)]
    session = sessions[number] if number < len(sessions) else None
    queue = link.queue.statistics()
    waiting = sender.session.connection.waiting
    if stats.client_credit <= 0:
        held_by = "link credit: the client has granted none"
    elif session is not None and (held := _session_held_by(session)) is not None:
        held_by = held
    elif waiting.paused:
        held_by = (
            "outgoing_pending: the connection's waiting deliveries reached "
            "max_outgoing_pending_size; credit requests to queues are deferred"
        )
    elif stats.credit_req_in_flight:
        held_by = "queue: the link's credit request is in flight to its queue"
    elif stats.queue_credit > 0 and queue.ready == 0:
        held_by = f"queue: empty; it holds the link's credit of {stats.queue_credit}"
    else:
        held_by = None
    return {
        "name": sender.sender.name,
        "session": number,
        "queue": queue.name,
        "queue_ready": queue.ready,
        "unsettled": link.unsettled,
        **asdict(stats),
        "held_by": held_by,
    }


def _publisher(broker: Broker, publisher: IncomingLinkState) -> dict[str, object]:
    link = publisher.link
    stats = link.statistics()
    target = publisher.target
    queue = target.queue
    address = queue.statistics().name if queue is not None else target.exchange or ""
    inbound = publisher.connection.inbound
    if stats.held:
        held_by = (
            "memory budget: exhausted, and this link's queues hold at least half the "
            "mean of publishers' weight; no new credit until it is back under its low-water mark"
        )
    elif inbound is not None and inbound.budget_paused:
        held_by = "memory budget: its connection is not read"
    elif publisher.connection.account.paused:
        held_by = "account: its connection's debt reached the limit; its socket is not read"
    elif stats.credit <= 0 and stats.unconfirmed >= stats.max_link_credit:
        held_by = "unconfirmed: its messages are not yet stored; credit follows storage"
    elif stats.credit <= 0 and broker.publishing.budget.blocked:
        held_by = "memory budget: exhausted; credit is renewed within its headroom"
    else:
        held_by = None
    return {
        "name": publisher.receiver.name,
        "target": address,
        **asdict(stats),
        "held_by": held_by,
    }


# -- the budget -------------------------------------------------------------------------------


def budget_holders(broker: Broker) -> Generator[None, None, dict[str, object]]:
    """The budget and who holds it: each vhost's heaviest queues, the heaviest connections,
    held publishers and connections paused for it; one step per :data:`SLICE` queues."""
    queues: list[dict[str, object]] = []
    for vhost_name, vhost in list(broker.tenancy.vhosts.items()):
        registry = vhost.registry
        names = registry.queue_names()
        weighed: list[tuple[int, str]] = []
        for start in range(0, len(names), SLICE):
            for name in names[start : start + SLICE]:
                queue = registry.get(name)
                if queue is not None:
                    stats = queue.statistics()
                    weighed.append((stats.ready_bytes + stats.unacked_bytes, name))
            yield
        queues.extend(
            {"vhost": vhost_name, "name": name, "bytes": held}
            for held, name in heapq.nlargest(TOP_HOLDERS, weighed)
            if held
        )
    connections = [c for c in broker.connections if _entered(c)]
    heaviest = heapq.nlargest(TOP_HOLDERS, connections, key=_held_bytes)
    paused = [c for c in connections if c.inbound is not None and c.inbound.budget_paused]
    held = [p for p in broker.publishing.links if p.link.held and _entered(p.connection)]
    budget = broker.publishing.budget.statistics()
    return {
        **asdict(budget),
        "queues": queues,
        "connections": [{**_named(c), "bytes": _held_bytes(c)} for c in heaviest if _held_bytes(c)],
        "paused_count": len(paused),
        "paused": [_named(c) for c in _first(paused)],
        "held_publisher_count": len(held),
        "held_publishers": [
            {**_named(p.connection), "link": p.receiver.name} for p in _first(held)
        ],
    }


def _entered(state: ConnectionState) -> bool:
    return not state.closed and state.user is not None and state.vhost is not None


def _held_bytes(state: ConnectionState) -> int:
    """What the budget counts for the connection: bytes its writer and sessions hold for its
    consumers and bytes of its deliveries still arriving."""
    inbound = state.inbound
    unfinished = inbound.unfinished if inbound is not None else 0
    return state.writer.bytes_pending + state.waiting.bytes + unfinished


def _named(state: ConnectionState) -> dict[str, object]:
    assert state.user is not None
    assert state.vhost is not None
    return {"connection": state.name, "user": state.user.name, "vhost": state.vhost.name}


def _first(items: Iterable[T]) -> list[T]:
    return list(items)[:MAX_HELD_SHOWN]
