"""The adversary's steps: what it does, drawn from a seed, saved and replayed as JSON.

A step names an action, the connection slot it acts on and parameters drawn when it was
generated. Every random choice is made here, never while a step runs, so one list of steps is
one attack whatever the server answers: the run that found a breach, a replay of its file and
every subset the shrinker tries all send the same frames wherever the state still allows them
(``actions.py`` maps a parameter such as ``pick`` onto what exists at that moment).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = [
    "ACTIONS",
    "CONNECTIONS",
    "HTTP_ACTION",
    "QUEUES",
    "Params",
    "Step",
    "generate",
    "load",
    "save",
    "stream",
    "weights_from",
]

CONNECTIONS: Final = 4  # slots: enough for cross-connection effects, few enough to collide
QUEUES: Final = 5  # adv-q0..4: few names, so that steps keep meeting the same queues
EXCHANGES: Final = 4  # adv-x0..3, bound to each other at random: cycles come by themselves
ROUTING_KEYS: Final = ("", "k", "a.b", "#", "*.b", "q0", "adv-q1")
CREDITS: Final = (0, 1, 2, 5, 50, 500, 10_000, 2**31 - 1, 2**32 - 1)
WINDOWS: Final = (0, 1, 2, 10, 2**31 - 1, 2**32 - 1)
BODY_SIZES: Final = (0, 16, 1000, 20_000, 70_000, 300_000)
# Past the default max-message-size (8 MiB) and past the whole 64 MiB budget of the runs.
OVERSIZED: Final = (9 * 2**20, 70 * 2**20)
FRAME_SIZES: Final = (512, 4096, 65536, 2**32 - 1)
SPANS: Final = (0, 0, 1, 3, 20, 1000, 2**31)  # how far past ``first`` a disposition reaches

Params = dict[str, int | str | bool | None]
# With --workers N: the actions that attach consumers or publishers to a queue, which may be
# aimed at a queue of another worker than their connection's (actions.py maps the name), and
# how often: most of them, since crossing the channel is what a multi-worker run is for.
FAR_ACTIONS: Final = frozenset(
    {"consume", "consume-filtered", "publisher", "reject-fanout", "manage-cycle", "delivery-limit"}
)
FAR_SHARE: Final = 0.75
# The consumer attaches whose source may list the outcomes its client will give (checked by
# gateway/rules/outcomes.py), and how: mostly not at all (the field absent, as most clients
# send it), else a valid list, a lone symbol, a list with an outcome no server takes, an empty
# list, or a long one of valid or of unknown outcomes (actions.py builds each). Drawn from a
# third generator, so that a seed's steps are otherwise those it drew before they were.
OUTCOME_ACTIONS: Final = frozenset({"consume", "consume-filtered"})
# RabbitMQ's HTTP API (gateway/http/), attacked by steps of their own drawn from a fourth
# generator and slipped in between the others: a seed's AMQP steps stay those it drew before
# the API was attacked. Their share of all steps is the action's weight over all the weights.
HTTP_ACTION: Final = "http-api"
HTTP_REQUESTS: Final = (
    "declare-queue",
    "declare-exchange",
    "bind",
    "publish",
    "publish",
    "publish",
    "get",
    "get",
    "purge",
    "delete-queue",
    "delete-exchange",
    "list",
    "bad",
)
# What a declared queue is: RabbitMQ's arguments the AMQP steps also use, by name (actions.py).
HTTP_QUEUE_KINDS: Final = ("plain", "quorum", "stream", "length-1", "ttl-0-dlx", "lazy-bad")
# Bodies of an HTTP publish: up to the 64 KiB request limit, and one past it.
HTTP_BODY_SIZES: Final = (0, 100, 4000, 60_000, 70_000)
OUTCOME_LISTS: Final = (
    *(None,) * 6,
    "valid",
    "single",
    "unknown",
    "empty",
    "long",
    "long-unknown",
)


@dataclass(frozen=True)
class Step:
    """One action on one connection slot, with every parameter it needs."""

    action: str
    slot: int
    params: Params = field(default_factory=dict)

    def describe(self) -> str:
        """One line for logs and reproductions."""
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        return f"{self.action}@{self.slot}({shown})"


def _choice(
    rng: random.Random, values: Sequence[int | str | bool | None]
) -> int | str | bool | None:
    return values[rng.randrange(len(values))]


def _queue(rng: random.Random) -> str:
    return f"adv-q{rng.randrange(QUEUES)}"


def _exchange(rng: random.Random) -> str:
    return f"adv-x{rng.randrange(EXCHANGES)}"


def _address(rng: random.Random) -> str | None:
    """Where a link or a message goes: queues, exchanges, built-ins, learned and bad ones."""
    kind = rng.randrange(10)
    if kind < 4:
        return f"/queues/{_queue(rng)}"
    if kind < 6:
        return f"/exchanges/{_exchange(rng)}/{_choice(rng, ROUTING_KEYS)}"
    if kind == 6:
        return f"/exchanges/amq.topic/{_choice(rng, ROUTING_KEYS)}"
    if kind == 7:
        return "learned"  # an address a dynamic attach or Direct Reply-To answered with
    return str(_choice(rng, ("/queues/", "/exchanges/", "nowhere", "/queues/a%2Fb", "")))


def _connect(rng: random.Random) -> Params:
    return {
        "max_frame_size": _choice(rng, FRAME_SIZES),
        "idle_ms": _choice(rng, (None, None, 2000, 60_000)),
        "sasl": rng.random() < 0.8,
        "reading": rng.random() < 0.9,
    }


def _begin(rng: random.Random) -> Params:
    return {
        "channel": rng.randrange(3),
        "incoming_window": _choice(rng, WINDOWS),
        "outgoing_window": _choice(rng, WINDOWS),
        "handle_max": _choice(rng, (None, None, 0, 3, 2**32 - 1)),
    }


def _link_options(rng: random.Random) -> Params:
    return {
        "channel": rng.randrange(3),
        "snd_settle_mode": _choice(rng, (None, "unsettled", "settled", "mixed")),
        "rcv_settle_mode": _choice(rng, (None, "first", "second")),
        "credit": _choice(rng, CREDITS),
        "drain": rng.random() < 0.2,
        "max_message_size": _choice(rng, (None, None, 0, 100, 2**20)),
    }


def _consume(rng: random.Random) -> Params:
    return _link_options(rng) | {
        "address": _address(rng),
        "copy": rng.random() < 0.15,
        "stream_offset": _choice(rng, (None, None, "first", "last", "next")),
    }


def _filtered(rng: random.Random) -> Params:
    """A consumer with filters, costly, malformed or plain."""
    return _consume(rng) | {
        "filter": _choice(
            rng,
            (
                "selector-cheap",
                "selector-deep",
                "selector-long",
                "selector-bad",
                "selector-like",
                "sql",
                "properties",
                "application-properties",
                "stream-filter",
                "unknown",
            ),
        ),
    }


def _outcomes(rng: random.Random) -> Params:
    """Which outcomes a consumer's source lists (nothing: no field), and a pick among them."""
    kind = _choice(rng, OUTCOME_LISTS)
    if kind is None:
        return {}
    return {"outcomes": kind, "outcomes_pick": rng.randrange(1 << 16)}


def _publish_link(rng: random.Random) -> Params:
    return _link_options(rng) | {"address": _choice(rng, (None, _address(rng), _address(rng)))}


def _publish(rng: random.Random) -> Params:
    return {
        "pick": rng.randrange(1 << 16),
        "count": _choice(rng, (1, 1, 2, 10, 100)),
        "body": _choice(rng, BODY_SIZES),
        "settled": rng.random() < 0.3,
        "ttl0": rng.random() < 0.15,
        "to": _address(rng),
        "subject": _choice(rng, (None, "a", "b", "long")),
        "priority": _choice(rng, (None, 0, 9, 255)),
        "overrun": rng.random() < 0.1,
    }


def _publish_cc(rng: random.Random) -> Params:
    return _publish(rng) | {
        "cc": _choice(rng, ("keys", "many-keys", "not-a-list", "empty", "mixed-types")),
    }


def _publish_annotated(rng: random.Random) -> Params:
    return _publish(rng) | {"annotation_bytes": _choice(rng, (100, 10_000, 1_000_000))}


def _unfinished(rng: random.Random) -> Params:
    return {
        "pick": rng.randrange(1 << 16),
        "frames": _choice(rng, (1, 2, 20, 100)),
        "chunk": _choice(rng, (100, 4000, 60_000)),
        "aborted": rng.random() < 0.2,
        "finish_later": rng.random() < 0.3,
    }


def _oversized(rng: random.Random) -> Params:
    return {"pick": rng.randrange(1 << 16), "body": _choice(rng, OVERSIZED)}


def _flow(rng: random.Random) -> Params:
    return {
        "pick": rng.randrange(1 << 16),
        "credit": _choice(rng, CREDITS),
        "drain": rng.random() < 0.3,
        "echo": rng.random() < 0.2,
        "incoming_window": _choice(rng, (None, None, *WINDOWS)),
        "session_only": rng.random() < 0.1,
        "bad_handle": rng.random() < 0.05,
    }


def _disposition(rng: random.Random) -> Params:
    return {
        "pick": rng.randrange(1 << 16),
        "span": _choice(rng, SPANS),
        "outcome": _choice(rng, ("accepted", "released", "rejected", "modified", "received", None)),
        "delivery_failed": rng.random() < 0.5,
        "undeliverable_here": rng.random() < 0.3,
        "annotation_bytes": _choice(rng, (None, None, 50, 5000, 500_000)),
        "settled": rng.random() < 0.8,
        "role_sender": rng.random() < 0.05,
    }


def _management(requests: Sequence[str], collect: float) -> Callable[[random.Random], Params]:
    """Management requests of one family; the reply link gets credit with chance ``collect``."""

    def draw(rng: random.Random) -> Params:
        return {
            "request": _choice(rng, requests),
            "queue": _queue(rng),
            "exchange": _exchange(rng),
            "other_exchange": _exchange(rng),
            "key": _choice(rng, ROUTING_KEYS),
            "exchange_type": _choice(
                rng, ("direct", "fanout", "topic", "headers", "x-consistent-hash", "bogus")
            ),
            "queue_type": _choice(rng, (None, None, "classic", "quorum", "stream", "bogus")),
            "ttl": _choice(rng, (None, None, 0, 1, 1000)),
            "dead_letter": _choice(rng, (None, "exchange", "exchange", "default")),
            "max_length": _choice(rng, (None, None, 0, 1, 10)),
            "overflow": _choice(rng, (None, "drop-head", "reject-publish", "reject-publish-dlx")),
            "expires": _choice(rng, (None, None, 1, 1000)),
            "count": _choice(rng, (1, 1, 3, 30, 300)),
            "collect": rng.random() < collect,
        }

    return draw


def _cycle(rng: random.Random) -> Params:
    """A dead-letter cycle: two queues dead-lettering into each other, fed by a third."""
    return {
        "feed": _queue(rng),
        "queue": _queue(rng),
        "other_queue": _queue(rng),
        "exchange": _exchange(rng),
        "other_exchange": _exchange(rng),
        "ttl": _choice(rng, (0, 0, 1, None)),
        "reject": rng.random() < 0.6,  # the feed's consumer rejects: x-death says "rejected"
        "max_length": _choice(rng, (None, None, 0, 1)),
        "messages": _choice(rng, (1, 1, 10)),
    }


def _delivery_limit(rng: random.Random) -> Params:
    """Deliveries of a queue with ``x-delivery-limit`` dead-lettering into a fanout, taken
    unsettled and then let go with the link or connection: each comes back a failed attempt, at
    its limit a letter with ``width`` copies and no consumer left to charge (docs/bounds.md)."""
    return {
        "feed": _queue(rng),
        "exchange": _exchange(rng),
        "width": _choice(rng, (2, 10, 50)),
        "messages": _choice(rng, (10, 170, 1000)),
        "body": _choice(rng, (100, 4000, 30_000)),
        "limit": _choice(rng, (0, 1, 2)),
        "end": _choice(rng, ("drop", "close", "detach")),
    }


def _reject_fanout(rng: random.Random) -> Params:
    """A queue dead-lettering into a fanout bound back to it and to others, whose consumer
    rejects what comes: each rejection makes ``width`` copies, one back to be rejected again."""
    return {
        "feed": _queue(rng),
        "exchange": _exchange(rng),
        "width": _choice(rng, (2, 3, 10, 50)),
        "messages": _choice(rng, (1, 1, 10)),
        "body": _choice(rng, (100, 4000, 30_000)),
        "credit": _choice(rng, (1, 50, 10_000)),
        "unsettled": rng.random() < 0.3,  # it settles none of them: the letters are its outcomes
    }


def _chain(rng: random.Random) -> Params:
    """Exchanges bound one to the next, auto-deleted or not, then the head deleted."""
    return {
        "length": _choice(rng, (3, 50, 1500)),
        "auto_delete": rng.random() < 0.7,
        "prefix": f"adv-chain{rng.randrange(3)}",
    }


def _topic(rng: random.Random) -> Params:
    """Many topic bindings on one exchange, then messages naming many keys in x-cc."""
    return {
        "exchange": _exchange(rng),
        "bindings": _choice(rng, (10, 300, 1000)),
        "keys": _choice(rng, (10, 256, 5000)),
        "messages": _choice(rng, (1, 3)),
    }


def _churn(rng: random.Random) -> Params:
    """Connections opened and left at once, with a session and links or without."""
    return {
        "connections": _choice(rng, (5, 20, 50)),
        "links": _choice(rng, (0, 1, 10)),
        "how": _choice(rng, ("drop", "close", "reset")),
    }


def _hoard(rng: random.Random) -> Params:
    """Connections kept open with links of large properties (up to 4 MB each)."""
    return {
        "connections": _choice(rng, (1, 4, 8)),
        "links": _choice(rng, (10, 40)),
        "kib": _choice(rng, (1, 30, 100)),
    }


def _dynamic(rng: random.Random) -> Params:
    return _link_options(rng) | {
        "repeat": _choice(rng, (1, 1, 10, 100)),
        "receiver": rng.random() < 0.7,
        "capability": _choice(rng, ("temporary-queue", None, "bogus")),
        "expiry_policy": _choice(rng, (None, "link-detach", "never")),
    }


def _reply_to(rng: random.Random) -> Params:
    return _link_options(rng) | {
        "settled": rng.random() < 0.8,
        "expiry_policy": _choice(rng, ("link-detach", "link-detach", "never", None)),
        "replies": _choice(rng, (0, 1, 5, 100)),
    }


def _detach(rng: random.Random) -> Params:
    return {
        "pick": rng.randrange(1 << 16),
        "closed": rng.random() < 0.7,
        "error": rng.random() < 0.2,
    }


def _end(rng: random.Random) -> Params:
    return {"channel": rng.randrange(3), "error": rng.random() < 0.2}


def _garbage(rng: random.Random) -> Params:
    return {
        "kind": _choice(rng, ("random", "bad-header", "truncated", "huge-size", "unknown-type")),
        "seed": rng.randrange(1 << 30),
        "size": _choice(rng, (1, 8, 64, 600)),
    }


def _metrics(rng: random.Random) -> Params:
    """Requests to the metrics endpoint: whole, half sent and left open, or not HTTP at all."""
    return {
        "sockets": _choice(rng, (1, 10, 100)),
        "how": _choice(rng, ("scrape", "half", "half", "garbage")),
    }


def _http_api(rng: random.Random) -> Params:
    """A request to RabbitMQ's HTTP API: what it is, its targets, and how it is sent (whole and
    read, several on one connection before reading any, or half sent and left open)."""
    return {
        "request": _choice(rng, HTTP_REQUESTS),
        "queue": _queue(rng),
        "exchange": _exchange(rng),
        "key": _choice(rng, ROUTING_KEYS),
        "kind": _choice(rng, HTTP_QUEUE_KINDS),
        "type": _choice(rng, ("fanout", "topic", "direct", "headers", "x-consistent-hash")),
        "body": _choice(rng, HTTP_BODY_SIZES),
        "persistent": rng.random() < 0.5,
        "count": _choice(rng, (1, 1, 10, 100, 1000)),
        "ackmode": _choice(rng, ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true")),
        "how": _choice(rng, ("whole", "whole", "whole", "pipelined", "half")),
        "repeat": _choice(rng, (1, 1, 8, 64)),
    }


def _nothing(rng: random.Random) -> Params:
    return {}


def _toggle(rng: random.Random) -> Params:
    return {"reading": rng.random() < 0.5}


# Each action's name and how its parameters are drawn; ``actions.py`` performs them.
ACTIONS: Final[dict[str, Callable[[random.Random], Params]]] = {
    "connect": _connect,
    "begin": _begin,
    "consume": _consume,
    "consume-filtered": _filtered,
    "publisher": _publish_link,
    "publish": _publish,
    "publish-cc": _publish_cc,
    "publish-annotated": _publish_annotated,
    "publish-unfinished": _unfinished,
    "publish-oversized": _oversized,
    "flow": _flow,
    "disposition": _disposition,
    "manage-queue": _management(("declare-queue",), 1.0),
    "manage-exchange": _management(("declare-exchange",), 1.0),
    "manage-bind": _management(("bind-queue", "bind-exchange"), 1.0),
    "manage-delete": _management(("delete-queue", "delete-exchange", "purge"), 1.0),
    "manage-read": _management(("list-queues", "get-queue", "bad-path"), 1.0),
    "manage-uncollected": _management(("list-queues", "get-queue", "declare-queue"), 0.0),
    "manage-cycle": _cycle,
    "reject-fanout": _reject_fanout,
    "delivery-limit": _delivery_limit,
    "manage-chain": _chain,
    "topic-cc": _topic,
    "churn": _churn,
    "hoard-endpoints": _hoard,
    "metrics": _metrics,
    HTTP_ACTION: _http_api,
    "dynamic": _dynamic,
    "direct-reply-to": _reply_to,
    "detach": _detach,
    "end": _end,
    "close": _nothing,
    "drop": _nothing,
    "reset": _nothing,
    "reading": _toggle,
    "garbage": _garbage,
}

# How often each action is drawn by default: the plumbing (connect, begin, links) often
# enough that the rest has something to act on.
DEFAULT_WEIGHTS: Final[Mapping[str, int]] = {
    "connect": 6,
    "begin": 6,
    "consume": 8,
    "consume-filtered": 3,
    "publisher": 8,
    "publish": 14,
    "publish-cc": 3,
    "publish-annotated": 2,
    "publish-unfinished": 3,
    "publish-oversized": 1,
    "flow": 10,
    "disposition": 10,
    "manage-queue": 3,
    "manage-exchange": 2,
    "manage-bind": 3,
    "manage-delete": 1,
    "manage-read": 1,
    "manage-uncollected": 1,
    "manage-cycle": 1,
    "reject-fanout": 1,
    "delivery-limit": 1,
    "manage-chain": 1,
    "topic-cc": 1,
    "churn": 1,
    "hoard-endpoints": 1,
    "metrics": 1,
    HTTP_ACTION: 3,
    "dynamic": 2,
    "direct-reply-to": 2,
    "detach": 4,
    "end": 2,
    "close": 1,
    "drop": 1,
    "reset": 1,
    "reading": 2,
    "garbage": 1,
}


def weights_from(only: Sequence[str] = (), without: Sequence[str] = ()) -> dict[str, int]:
    """The default weights restricted to ``only`` (if given) and without ``without``."""
    unknown = (set(only) | set(without)) - set(ACTIONS)
    if unknown:
        raise ValueError(f"unknown actions {sorted(unknown)}; known: {sorted(ACTIONS)}")
    chosen = set(only) or set(ACTIONS)
    return {a: w for a, w in DEFAULT_WEIGHTS.items() if a in chosen and a not in without}


def stream(seed: int, weights: Mapping[str, int], workers: int = 1) -> Iterator[Step]:
    """Steps drawn from ``seed`` without end: the same seed and weights give the same steps.

    Against ``workers`` > 1, the steps of :data:`FAR_ACTIONS` say whether they aim at a queue
    another worker owns than the one serving their connection (``far``), drawn from a second
    generator so that a seed's steps are otherwise those it draws against one worker. The
    outcomes a consumer's source lists come from a third (:data:`OUTCOME_ACTIONS`), the HTTP
    API's steps from a fourth (:data:`HTTP_ACTION`), each slipped in before a step.
    """
    rng = random.Random(seed)
    far = random.Random(f"far:{seed}") if workers > 1 else None
    outcomes = random.Random(f"outcomes:{seed}")
    http = random.Random(f"http:{seed}")
    names = sorted(name for name in weights if name != HTTP_ACTION)
    chances = [weights[n] for n in names]
    http_share = weights.get(HTTP_ACTION, 0) / max(1, sum(weights.values()))
    while True:
        if http_share and (not names or http.random() < http_share):
            yield Step(HTTP_ACTION, 0, _http_api(http))
            if not names:
                continue
        action = rng.choices(names, weights=chances)[0]
        params = ACTIONS[action](rng)
        if far is not None and action in FAR_ACTIONS:
            params["far"] = far.random() < FAR_SHARE
        if action in OUTCOME_ACTIONS:
            params |= _outcomes(outcomes)
        yield Step(action, rng.randrange(CONNECTIONS), params)


def generate(seed: int, count: int, weights: Mapping[str, int], workers: int = 1) -> list[Step]:
    """The first ``count`` steps of ``stream(seed, weights, workers)``."""
    return list(itertools.islice(stream(seed, weights, workers), count))


def save(path: Path, steps: Sequence[Step], **context: object) -> None:
    """Write a replayable reproduction: ``python -m bench adversary --replay PATH``."""
    document = {
        **context,
        "steps": [{"action": s.action, "slot": s.slot, "params": s.params} for s in steps],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def load(path: Path) -> tuple[list[Step], dict[str, object]]:
    """The steps of a saved reproduction and its context (seed, budget, breach)."""
    document = json.loads(path.read_text())
    steps = [Step(s["action"], s["slot"], s["params"]) for s in document.pop("steps")]
    return steps, document
