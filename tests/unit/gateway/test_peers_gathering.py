"""A management request waiting for other workers' answers lets go of its caller once answered
(adversary seed 65972, gateway/peers.py's ``_Gathering``): its timer's task named it, and the
cycle held the request's link pair and their proton objects past the client's connection,
freed by a collection at any moment on any thread, where the worker aborted."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from support.collector import collector_off
from support.worker_one import worker_one

from sluicegate.session.channel.queries import Asked, Figures


class Caller:
    """Stands for what a request's answer names: its link pair, its proton objects."""

    def __init__(self) -> None:
        self.answers: list[Asked | None] = []

    def answered(self, failure: Asked | None) -> None:
        self.answers.append(failure)


def _answer(caller: Caller, failure: Asked | None) -> None:
    caller.answered(failure)


@pytest.fixture
def no_collection() -> Iterator[None]:
    with collector_off():
        yield


@pytest.mark.usefixtures("no_collection")
def test_an_answered_request_holds_nothing_of_its_caller(tmp_path: Path) -> None:
    with worker_one(tmp_path) as worker:
        figures = Figures()
        asked = figures.asked["/", "q", "counts"] = Asked()
        caller = Caller()
        gone = weakref.ref(caller)
        worker.peers.gather(figures, partial(_answer, caller))
        assert len(worker.peers.gathering) == 1
        asked.error = "the owner is not serving"
        worker.peers._gathered()
        assert len(caller.answers) == 1
        del caller
        # The cancelled timer's task stays in the container's heap until its deadline: the
        # request it names holds nothing of the caller, without a collection.
        assert gone() is None
        assert worker.peers.gathering == {}
