"""Worker 0's sum of the workers' metrics pages: amounts add up, points in time take the
earliest, and the page says how many workers it covers."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sluicegate.gateway.worker_metrics import merge

PAGE_0 = b"""# HELP sluicegate_queue_messages_ready Messages ready.
# TYPE sluicegate_queue_messages_ready gauge
sluicegate_queue_messages_ready{queue="a",vhost="/"} 3.0
# HELP sluicegate_messages_published Messages published.
# TYPE sluicegate_messages_published counter
sluicegate_messages_published_total 10.0
# HELP process_start_time_seconds Start time of the process.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 200.0
"""
PAGE_1 = b"""# HELP sluicegate_queue_messages_ready Messages ready.
# TYPE sluicegate_queue_messages_ready gauge
sluicegate_queue_messages_ready{queue="a",vhost="/"} 4.0
sluicegate_queue_messages_ready{queue="b",vhost="/"} 1.0
# HELP sluicegate_messages_published Messages published.
# TYPE sluicegate_messages_published counter
sluicegate_messages_published_total 5.0
# HELP process_start_time_seconds Start time of the process.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 100.0
"""


def _samples(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page.decode())
        for sample in family.samples
    }


def test_amounts_add_up_and_start_times_take_the_earliest() -> None:
    merged = _samples(merge([PAGE_0, PAGE_1], 3))
    assert merged == {
        ("sluicegate_queue_messages_ready", (("queue", "a"), ("vhost", "/"))): 7.0,
        ("sluicegate_queue_messages_ready", (("queue", "b"), ("vhost", "/"))): 1.0,
        ("sluicegate_messages_published_total", ()): 15.0,
        ("process_start_time_seconds", ()): 100.0,
        ("sluicegate_workers", ()): 3.0,
        # One of three workers did not answer: the page says so.
        ("sluicegate_workers_scraped", ()): 2.0,
    }


def test_one_page_comes_back_as_it_was_with_the_worker_counts() -> None:
    merged = _samples(merge([PAGE_0], 1))
    assert merged.pop(("sluicegate_workers", ())) == 1.0
    assert merged.pop(("sluicegate_workers_scraped", ())) == 1.0
    assert merged == _samples(PAGE_0)


def test_a_page_that_is_not_metrics_is_left_out_and_not_counted() -> None:
    merged = _samples(merge([PAGE_0, b"<html>another service</html>", b"\xff\xfe"], 3))
    assert merged[("sluicegate_workers_scraped", ())] == 1.0
    assert merged[("sluicegate_messages_published_total", ())] == 10.0
