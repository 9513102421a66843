"""The outcomes a consumer's source lists come from a generator of their own
(docs/adversary.md): a seed's steps are those it drew before, and every breach saved before
replays the same; each way of listing them is drawn, and the longest fits the server's frame."""

from __future__ import annotations

import random

from support.adversary.actions import outcomes_field
from support.adversary.steps import (
    ACTIONS,
    CONNECTIONS,
    DEFAULT_WEIGHTS,
    HTTP_ACTION,
    OUTCOME_ACTIONS,
    OUTCOME_LISTS,
    generate,
)
from support.frames import described, encode

from sluicegate.gateway.config import DEFAULT_MAX_FRAME_SIZE

OUTCOME_PARAMS = ("outcomes", "outcomes_pick")


def test_consumer_steps_add_outcomes_and_change_no_other_draw() -> None:
    drawn = [s for s in generate(64000, 2_000, DEFAULT_WEIGHTS) if s.action != HTTP_ACTION]
    # The seed's steps as drawn from its main generator alone, as stream() drew them before.
    rng = random.Random(64000)
    names = sorted(name for name in DEFAULT_WEIGHTS if name != HTTP_ACTION)
    chances = [DEFAULT_WEIGHTS[name] for name in names]
    for step in drawn:
        action = rng.choices(names, weights=chances)[0]
        params = ACTIONS[action](rng)
        assert (step.action, step.slot) == (action, rng.randrange(CONNECTIONS))
        assert {k: v for k, v in step.params.items() if k not in OUTCOME_PARAMS} == params
        if action not in OUTCOME_ACTIONS:
            assert "outcomes" not in step.params
    kinds = {s.params.get("outcomes") for s in drawn if s.action in OUTCOME_ACTIONS}
    assert kinds == set(OUTCOME_LISTS)


def test_every_outcomes_list_fits_the_servers_default_frame() -> None:
    for kind in OUTCOME_LISTS:
        terminus = outcomes_field({"outcomes": kind, "outcomes_pick": 0xFFFF})
        assert (terminus is None) == (kind is None)
        source = described("source", address="/queues/adv-q0", **(terminus or {}))
        assert len(encode(source)) < DEFAULT_MAX_FRAME_SIZE - 1000  # the ATTACH's other fields
