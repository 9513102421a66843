"""Against several workers a seed draws the steps it draws against one process, plus where each
link step aims (docs/adversary.md): a breach found with one worker replays the same with two."""

from __future__ import annotations

from support.adversary.steps import DEFAULT_WEIGHTS, FAR_ACTIONS, generate


def test_workers_add_far_to_the_link_steps_and_change_no_other_draw() -> None:
    alone = generate(31, 2_000, DEFAULT_WEIGHTS)
    spread = generate(31, 2_000, DEFAULT_WEIGHTS, workers=2)
    assert [(s.action, s.slot) for s in alone] == [(s.action, s.slot) for s in spread]
    for one, two in zip(alone, spread, strict=True):
        assert "far" not in one.params
        assert {k: v for k, v in two.params.items() if k != "far"} == one.params
        assert ("far" in two.params) == (two.action in FAR_ACTIONS)
    aimed = [s.params["far"] for s in spread if s.action in FAR_ACTIONS]
    assert any(aimed)
    assert not all(aimed)
