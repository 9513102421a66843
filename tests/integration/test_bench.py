"""``python -m bench`` end to end, very short: a scenario against a test server, its outputs.

Figures are not asserted (they depend on the machine); the files, the table's shape, the counts
and the flow-control bound the slow-consumer scenario exists to show are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from integration.process_tree import run_or_explain

from sluicegate.gateway.config import DEFAULT_WRITER_BUFFER_SIZE
from sluicegate.gateway.reading import READ_BATCH
from sluicegate.session.memory_budget import CEILING_SHARE
from sluicegate.session.outbound import DEFAULT_MAX_QUEUE_CREDIT

RUN_TIMEOUT_S = 240  # a loaded 2-core machine; the runs themselves take seconds
# Beyond the run's own deadline: time to dump the stacks of a hung run before pytest-timeout.
pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 120)
# "outgoing_pending ≤ 256 + a few": the queue's batch plus credit replies and FLOWs queued with it.
PENDING_SLACK = 16
MiB = 1024 * 1024


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the bench CLI as a user would, from the repository root."""
    return run_or_explain(
        [sys.executable, "-m", "bench", *args], RUN_TIMEOUT_S, Path(__file__).parents[2]
    )


def table_rows(stdout: str) -> list[dict[str, str]]:
    """The Markdown table's rows as heading → cell."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    headings = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(headings, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]


@pytest.mark.slow
def test_throughput_against_a_test_server(server: RunningServer, tmp_path: Path) -> None:
    run = bench(
        "throughput", "--url", server.url, "--credit", "1000", "--duration", "3",
        "--output", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    [row] = table_rows(run.stdout)
    assert (row["server"], row["case"]) == ("server", "credit 1,000")
    assert row["RSS peak MB"] == "-"  # a server given by URL without --pid is not sampled
    report = json.loads((tmp_path / "throughput.json").read_text())
    [record] = report["records"]
    quiver = record["parameters"]["quiver"]["results"]
    assert quiver["count"] == quiver["sent"] == quiver["accepted"] > 0
    assert record["figures"]["messages"] == quiver["count"]
    assert (tmp_path / "throughput.png").stat().st_size > 0


@pytest.mark.slow
def test_slow_consumer_on_a_started_server(tmp_path: Path) -> None:
    run = bench(
        "slow-consumer", "--messages", "20000", "--duration", "3", "--output", str(tmp_path)
    )
    assert run.returncode == 0, run.stderr
    [record] = json.loads((tmp_path / "slow-consumer.json").read_text())["records"]
    figures = record["figures"]
    assert 0 < figures["taken"] <= 20000
    assert figures["RSS peak MB"] > 0
    assert 0 < figures["pending max"] <= DEFAULT_MAX_QUEUE_CREDIT + PENDING_SLACK
    names = {series["name"] for series in record["series"]}
    assert {"server RSS", "outgoing_pending max", "consumer rate"} <= names
    assert (tmp_path / "slow-consumer.png").stat().st_size > 0


def test_a_missing_server_is_one_line(tmp_path: Path) -> None:
    run = bench(
        "throughput", "--url", "amqp://127.0.0.1:1/", "--duration", "1", "--output", str(tmp_path)
    )
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.splitlines()[-1] == (
        "python -m bench throughput: server: receiver 1: cannot connect to 127.0.0.1:1: "
        "Connection refused"
    )


@pytest.mark.slow
def test_fanout_delivers_every_copy(tmp_path: Path) -> None:
    run = bench("fanout", "--queues", "3", "--duration", "2", "--output", str(tmp_path))
    assert run.returncode == 0, run.stderr
    [record] = json.loads((tmp_path / "fanout.json").read_text())["records"]
    figures = record["figures"]
    assert figures["sent"] == figures["accepted"] > 0
    assert figures["copies taken"] == 3 * figures["accepted"]


@pytest.mark.slow
def test_memory_budget_holds_the_publisher(tmp_path: Path) -> None:
    run = bench(
        "memory-budget", "--memory-budget", "4MiB", "--duration", "4", "--rate", "100",
        "--output", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    [record] = json.loads((tmp_path / "memory-budget.json").read_text())["records"]
    figures = record["figures"]
    assert figures["sent"] == figures["accepted"] > figures["taken"] > 0
    assert figures["publisher blocked s"] > 0  # the budget withheld credit
    # docs/operations.md: the ceiling (the limit plus an eighth), one read of the reactor, and
    # what the consumer's connection holds on its way out, which the budget counts but does
    # not hold back: its writer's buffer plus one frame (proton's client default, 32 KiB).
    budget = 4 * MiB
    frame = 32 * 1024
    bound = budget + budget // CEILING_SHARE + READ_BATCH + DEFAULT_WRITER_BUFFER_SIZE + frame
    assert figures["budget used peak MB"] * MiB <= bound


@pytest.mark.slow
def test_connections_exchange_on_every_connection(tmp_path: Path) -> None:
    run = bench("connections", "--connections", "30", "--messages", "5", "--output", str(tmp_path))
    assert run.returncode == 0, run.stderr
    [record] = json.loads((tmp_path / "connections.json").read_text())["records"]
    assert record["figures"]["connections"] == 30
    assert record["figures"]["messages"] == 150


@pytest.mark.slow
def test_a_tenant_gets_its_quotas_and_no_more(tmp_path: Path) -> None:
    run = bench(
        "tenant", "--queues", "20", "--exchanges", "4", "--bindings", "30", "--connections", "2",
        "--sessions", "3", "--output", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    [record] = json.loads((tmp_path / "tenant.json").read_text())["records"]
    figures = record["figures"]
    assert figures["queues ok/refused"] == "20/20"
    assert figures["exchanges ok/refused"] == "4/4"
    assert figures["bindings ok/refused"] == "30/30"
    assert figures["connections ok/refused"] == "2/1"
    assert figures["sessions ok/refused"] == "3/1"
    assert figures["links"] == 3 * 256


@pytest.mark.alone  # bounds a latency: docs/testing.md
@pytest.mark.slow
def test_hostile_partial_deliveries_are_cut_off_and_the_prober_served(tmp_path: Path) -> None:
    run = bench("hostile", "--attack", "partial", "--duration", "3", "--output", str(tmp_path))
    assert run.returncode == 0, run.stderr
    [record] = json.loads((tmp_path / "hostile.json").read_text())["records"]
    figures = record["figures"]
    # Closed with amqp:resource-limit-exceeded, or dropped before it read the CLOSE.
    assert "connection:" in figures["attacker"]
    assert figures["prober stalls"] == 0
    assert figures["prober trips"] > 0
    assert figures["peak - base MB"] < 64  # the budget: the unfinished cap is far below it
    assert (tmp_path / "hostile.png").exists()
