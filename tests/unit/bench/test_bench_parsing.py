"""What the bench reads back: Prometheus scrapes, quiver status rows, server start failures."""

from __future__ import annotations

import pytest

from bench.promtext import MetricsError, Sample, metric_total, parse_exposition
from bench.quiverlog import StatusRow, parse_status_row
from bench.servers import MissingFeature, _start_failure

METRIC = "sluicegate_session_outgoing_pending"

SCRAPE = f"""\
# HELP {METRIC} Deliveries queued in the session
# TYPE {METRIC} gauge
{METRIC}{{connection="c1",session="0"}} 256.0
{METRIC}{{connection="c2",session="0"}} 3.0
sluicegate_connections 2.0
sluicegate_queue_messages_ready{{queue="a \\"b\\""}} 1e+05
"""


def test_exposition_samples_with_labels_and_escapes() -> None:
    samples = parse_exposition(SCRAPE)
    assert samples[0] == Sample(METRIC, {"connection": "c1", "session": "0"}, 256.0)
    assert samples[2] == Sample("sluicegate_connections", {}, 2.0)
    assert samples[3] == Sample("sluicegate_queue_messages_ready", {"queue": 'a "b"'}, 100000.0)


def test_exposition_rejects_other_text() -> None:
    with pytest.raises(MetricsError):
        parse_exposition("<html>not metrics</html>")


def test_metric_total_sums_over_labels() -> None:
    assert metric_total(parse_exposition(SCRAPE), METRIC) == 259.0
    assert metric_total(parse_exposition(SCRAPE), "sluicegate_connections") == 2.0


def test_metric_total_of_an_absent_metric() -> None:
    assert metric_total(parse_exposition(SCRAPE), METRIC + "_max") is None


def test_status_row() -> None:
    line = "     4.0       34,969       7,098        34,967       7,098        32       4% 22.3M"
    assert parse_status_row(line) == StatusRow(4.0, 34969, 7098.0, 34967, 7098.0, 32.0)


def test_status_row_without_latency_and_with_a_finished_process() -> None:
    line = "     2.0            0           0             0           0         -            - -"
    assert parse_status_row(line) == StatusRow(2.0, 0, 0.0, 0, 0.0, None)


@pytest.mark.parametrize(
    "line",
    ["Time [s]     Sent [m]  Rate [m/s]  Received [m]  Rate [m/s]  Lat [ms]", "RESULTS", ""],
)
def test_not_a_status_row(line: str) -> None:
    assert parse_status_row(line) is None


def test_an_unknown_option_names_the_missing_feature() -> None:
    stderr = [
        "usage: sluicegate [-h] {serve,quiver} ...",
        "sluicegate: error: unrecognized arguments: --memory-budget 64MiB",
    ]
    failure = _start_failure(["python", "-m", "sluicegate", "serve"], 2, stderr)
    assert isinstance(failure, MissingFeature)
    assert "memory budget (issue 5" in str(failure)


def test_other_start_failures_quote_the_last_line() -> None:
    failure = _start_failure(
        ["python", "-m", "sluicegate", "serve"],
        1,
        ["sluicegate: cannot listen on x: Address in use"],
    )
    assert not isinstance(failure, MissingFeature)
    assert str(failure).endswith("cannot listen on x: Address in use")
