"""The Markdown table every scenario prints."""

from __future__ import annotations

from bench.record import Record, Report
from bench.table import cell_text, markdown_table


def test_cell_text() -> None:
    assert cell_text(None) == "-"
    assert cell_text(12345) == "12,345"
    assert cell_text(9029.4) == "9,029"
    assert cell_text(14.26) == "14.3"
    assert cell_text(True) == "yes"
    assert cell_text("naive") == "naive"


def test_numbers_right_aligned_text_left_missing_as_dash() -> None:
    table = markdown_table(
        ["server", "msg/s", "p99 ms"],
        [{"server": "sluicegate", "msg/s": 9029.0, "p99 ms": 48.9}, {"server": "naive"}],
    )
    assert table.splitlines() == [
        "| server     | msg/s | p99 ms |",
        "|------------|------:|-------:|",
        "| sluicegate | 9,029 |   48.9 |",
        "| naive      |     - |      - |",
    ]


def test_report_table_puts_server_and_case_first() -> None:
    report = Report("throughput", ["e2e msg/s"])
    report.records.append(Record("sluicegate", "credit 1,000", figures={"e2e msg/s": 6037.2}))
    report.records.append(Record("rabbitmq", "credit 1,000", figures={"e2e msg/s": 5116.0}))
    lines = report.table().splitlines()
    assert lines[0] == "| server     | case         | e2e msg/s |"
    assert lines[2:] == [
        "| sluicegate | credit 1,000 |     6,037 |",
        "| rabbitmq   | credit 1,000 |     5,116 |",
    ]


def test_report_json_keeps_figures_and_series() -> None:
    record = Record("sluicegate", "credit 1,000", {"credit": 1000}, {"e2e msg/s": 6000.0})
    document = Report("throughput", ["e2e msg/s"], [record]).to_json()
    assert document["scenario"] == "throughput"
    assert document["records"] == [
        {
            "server": "sluicegate",
            "case": "credit 1,000",
            "parameters": {"credit": 1000},
            "figures": {"e2e msg/s": 6000.0},
            "series": [],
        }
    ]
