"""Lines a client can provoke at will are logged in bursts per interval, the rest counted
(gateway/rare_warning.py): a loop of refused clients cannot write the log at its own pace."""

from __future__ import annotations

import logging

import pytest

from sluicegate.gateway.rare_warning import LOG_INTERVAL, RareWarning

LOGGER = logging.getLogger("test.rare_warning")


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER.name]


def test_a_burst_per_interval_then_a_line_that_counts_what_was_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warning = RareWarning("refused", burst=3, logger=LOGGER)
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        for index in range(100):
            warning.happened(index * 0.01, f"client {index}")
        assert _lines(caplog) == ["refused: client 0", "refused: client 1", "refused: client 2"]
        warning.happened(LOG_INTERVAL, "client 100")
        warning.happened(LOG_INTERVAL + 1, "client 101")
    assert _lines(caplog)[3:] == [
        "refused: client 100 (98 times since the last such line)",
        "refused: client 101",
    ]


def test_one_line_per_interval_by_default_at_its_level(caplog: pytest.LogCaptureFixture) -> None:
    warning = RareWarning("cannot accept", level=logging.INFO, logger=LOGGER)
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        for second in range(25):
            warning.happened(float(second), "EMFILE")
    assert _lines(caplog) == [
        "cannot accept: EMFILE",
        "cannot accept: EMFILE (10 times since the last such line)",
        "cannot accept: EMFILE (10 times since the last such line)",
    ]
    assert {r.levelno for r in caplog.records if r.name == LOGGER.name} == {logging.INFO}
