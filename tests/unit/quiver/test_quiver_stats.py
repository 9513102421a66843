"""The quiver's arithmetic and text on known inputs."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.clients.quiver.endpoint import parse_url
from sluicegate.clients.quiver.settings import Settings
from sluicegate.clients.quiver.stats import (
    Latency,
    ProcessUsage,
    Results,
    Span,
    cpu_percent,
    merge_spans,
    percentile,
    rate,
    render_configuration,
    render_results,
    status_heading,
    status_row,
    summarize,
    summarize_latency,
    summary_document,
)

MS = 1_000_000
S = 1_000_000_000


def test_percentile_is_nearest_rank() -> None:
    values = [10, 20, 30, 40]
    assert percentile(values, Fraction(50)) == 20
    assert percentile(values, Fraction(51)) == 30
    assert percentile(values, Fraction(100)) == 40
    assert percentile(values, Fraction(1)) == 10
    assert percentile(values, Fraction(0)) == 10


def test_percentile_99_9_of_1000_is_rank_999_exactly() -> None:
    values = list(range(1, 1001))
    assert percentile(values, Fraction("99.9")) == 999
    assert percentile(values, Fraction(99)) == 990
    assert percentile(values, Fraction(90)) == 900


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], Fraction(50))


@given(st.lists(st.integers(-(10**12), 10**12), min_size=1), st.fractions(0, 100))
def test_percentile_is_a_sample_with_enough_below(values: list[int], p: Fraction) -> None:
    ordered = sorted(values)
    value = percentile(ordered, p)
    assert value in ordered
    assert sum(v <= value for v in ordered) * 100 >= p * len(ordered)


def test_rate_counts_over_the_span() -> None:
    assert rate(1000, 0, 2 * S) == 500.0
    assert rate(1000, 5 * S, 5 * S) is None
    assert rate(0, 0, S) is None
    assert rate(10, None, S) is None


def test_merge_spans_adds_counts_and_covers_all() -> None:
    merged = merge_spans([Span(10, 5, 20), Span(5, 3, 15), Span(0, None, None)])
    assert merged == Span(15, 3, 20)
    assert merge_spans([]) == Span(0, None, None)


def test_summarize_latency_in_milliseconds() -> None:
    latencies = [i * MS for i in range(1, 101)]  # 1 ms .. 100 ms
    assert summarize_latency(latencies) == Latency(
        average_ms=50.5, p50_ms=50.0, p90_ms=90.0, p99_ms=99.0, p999_ms=100.0
    )
    assert summarize_latency([]) is None


def test_summarize_measures_end_to_end_from_first_send_to_last_receive() -> None:
    sent = Span(1000, 0, 1 * S)
    received = Span(1000, S // 2, 2 * S)
    results = summarize(sent, received, 1000, [2 * MS] * 1000)
    assert results.count == 1000
    assert results.sent == 1000
    assert results.accepted == 1000
    assert results.duration_s == 2.0
    assert results.sender_rate == 1000.0
    assert results.receiver_rate == pytest.approx(1000 / 1.5)
    assert results.end_to_end_rate == 500.0
    assert results.latency is not None
    assert results.latency.p99_ms == 2.0


def test_summarize_with_nothing_received() -> None:
    results = summarize(Span(10, 0, S), Span(0, None, None), None, [])
    assert results.duration_s is None
    assert results.end_to_end_rate is None
    assert results.latency is None


def test_cpu_percent_from_ticks() -> None:
    assert cpu_percent(100, 300, 100, 2.0) == 100.0
    assert cpu_percent(100, 150, 100, 2.0) == 25.0
    assert cpu_percent(0, 10, 100, 0.0) == 0.0


def _results() -> Results:
    return Results(
        count=100_696,
        sent=100_696,
        accepted=100_696,
        duration_s=30.0,
        sender_rate=120_422.4,
        receiver_rate=3_363.0,
        end_to_end_rate=3_359.2,
        latency=Latency(12.34, 11.0, 20.0, 30.5, 41.25),
    )


def test_results_block_has_quiver_layout() -> None:
    assert render_results(_results()).splitlines() == [
        "RESULTS",
        "",
        "Count ............................................... 100,696 messages",
        "Duration ............................................... 30.0 seconds",
        "Sender rate ......................................... 120,422 messages/s",
        "Receiver rate ......................................... 3,363 messages/s",
        "End-to-end rate ....................................... 3,359 messages/s",
        "",
        "Latency average ........................................ 12.3 ms",
        "Latency p50 ............................................ 11.0 ms",
        "Latency p90 ............................................ 20.0 ms",
        "Latency p99 ............................................ 30.5 ms",
        "Latency p99.9 .......................................... 41.2 ms",
    ]


def test_results_block_shows_dashes_when_nothing_was_measured() -> None:
    text = render_results(summarize(Span(0, None, None), Span(0, None, None), None, []))
    assert "Latency p99.9 " in text
    assert text.splitlines()[-1].endswith(" - ms")


def _settings(**overrides: object) -> Settings:
    url = "amqp://127.0.0.1:5672/queues/q1"
    fields: dict[str, object] = {"url": url, "endpoint": parse_url(url)}
    fields.update({"count": 2000, "duration": None} | overrides)
    return Settings(**fields)  # type: ignore[arg-type]


def test_configuration_block_lists_the_run() -> None:
    text = render_configuration(_settings(presettled=True, durable=True), "impl 1.0")
    assert text.splitlines() == [
        "CONFIGURATION",
        "",
        "Implementation ..................................... impl 1.0",
        "Address URL ................. amqp://127.0.0.1:5672/queues/q1",
        "Address .......................................... /queues/q1",
        "Count ................................................. 2,000 messages",
        "Body size ............................................... 100 bytes",
        "Credit window ......................................... 1,000 messages",
        "Senders ................................................... 1",
        "Receivers ................................................. 1",
        "Timeout ................................................ 10.0 seconds",
        "Flags ................................... durable, presettled",
    ]


def test_configuration_block_of_a_timed_run() -> None:
    text = render_configuration(_settings(count=None, duration=30.0), "impl")
    assert "Count" not in text
    assert any(
        line.endswith(" 30.0 seconds") and line.startswith("Duration ")
        for line in text.splitlines()
    )


def test_summary_document_is_plain_json_values() -> None:
    document = summary_document(_settings(), "impl", _results())
    assert document["configuration"] == {
        "implementation": "impl",
        "url": "amqp://127.0.0.1:5672/queues/q1",
        "host": "127.0.0.1",
        "port": 5672,
        "address": "/queues/q1",
        "count": 2000,
        "duration_s": None,
        "body_size": 100,
        "credit": 1000,
        "senders": 1,
        "receivers": 1,
        "timeout_s": 10.0,
        "durable": False,
        "presettled": False,
        "peer_to_peer": False,
    }
    results = document["results"]
    assert isinstance(results, dict)
    assert results["count"] == 100_696
    assert results["latency_ms"] == {
        "average": 12.34,
        "p50": 11.0,
        "p90": 20.0,
        "p99": 30.5,
        "p99.9": 41.25,
    }


def test_status_row_lines_up_with_its_heading() -> None:
    heading = status_heading(["sender 1", "receiver 1"])
    row = status_row(
        4.04,
        20_000,
        5_000.4,
        19_500,
        4_990.0,
        12.6,
        [ProcessUsage("sender 1", 97.4, 25 * 1024 * 1024), ProcessUsage("receiver 1", None, None)],
    )
    assert heading.split() == [
        "Time", "[s]", "Sent", "[m]", "Rate", "[m/s]", "Received", "[m]", "Rate", "[m/s]",
        "Lat", "[ms]", "S1", "CPU/RSS", "R1", "CPU/RSS",
    ]  # fmt: skip
    assert row.split() == [
        "4.0",
        "20,000",
        "5,000",
        "19,500",
        "4,990",
        "13",
        "97%",
        "25.0M",
        "-",
        "-",
    ]
    assert len(row) == len(heading)
