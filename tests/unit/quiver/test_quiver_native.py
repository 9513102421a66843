"""The C arrow's command line and the reading of its lines (clients/quiver/native.py).

Running the C arrow against a server is tests/integration/test_quiver_c.py's.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from sluicegate.clients.quiver.endpoint import parse_url
from sluicegate.clients.quiver.native import NativeArrow, arguments
from sluicegate.clients.quiver.reports import Failed, Ready, Scoreboard, SenderDone
from sluicegate.clients.quiver.settings import Settings, plan_arrows

URL = "amqp://127.0.0.1:5700/queues/q"
BINARY = Path("/cache/arrow")


def arrows(**overrides: object) -> NativeArrow:
    """The first sender of a planned run, as a C arrow (never started)."""
    fields: dict[str, object] = {"url": URL, "endpoint": parse_url(URL), "count": 10}
    fields.update({"duration": None, "impl": "c"} | overrides)
    senders, _ = plan_arrows(Settings(**fields), 1_000)  # type: ignore[arg-type]
    board = Scoreboard(multiprocessing.get_context("spawn"), 2)
    return NativeArrow(BINARY, senders[0], board, 1)


def test_the_command_line_carries_the_arrows_instructions() -> None:
    arrow = arrows(durable=True, credit=50)
    command = arguments(BINARY, arrow.config, None)
    assert command[:2] == [str(BINARY), "sender"]
    options = dict(zip(command[2::2], command[3::2], strict=False))
    assert options["--address"] == "/queues/q"
    assert options["--port"] == "5700"
    assert options["--count"] == "10"
    assert options["--credit"] == "50"
    assert options["--not-before"] == "1000"
    assert "--durable" in command
    assert "--presettled" not in command
    assert "--duration" not in command


def test_a_duration_run_has_no_count() -> None:
    command = arguments(BINARY, arrows(count=None, duration=2.5).config, "/tmp/l")
    assert command[command.index("--duration") + 1] == "2.5"
    assert command[command.index("--latencies") + 1] == "/tmp/l"
    assert "--count" not in command


def test_progress_goes_to_the_scoreboard_and_reports_are_queued() -> None:
    arrow = arrows()
    arrow.take_line("progress 120 100 0")
    assert (arrow.board.counts[1], arrow.board.settled[1]) == (120, 100)
    assert arrow.pending == []
    arrow.take_line("ready")
    arrow.take_line("done 10 9 5 7 2500000")
    assert arrow.pending == [Ready("sender 1"), SenderDone("sender 1", 10, 9, 5, 7, 0.0025)]


def test_no_message_means_no_times() -> None:
    arrow = arrows()
    arrow.take_line("done 0 0 -1 -1 1000")
    assert arrow.pending == [SenderDone("sender 1", 0, 0, None, None, 1e-6)]


def test_a_failure_and_garbage_are_one_line_each() -> None:
    arrow = arrows()
    arrow.take_line("failed cannot connect to 127.0.0.1:5700: Connection refused")
    arrow.take_line("progress 1 x")
    first, second = arrow.pending
    assert first == Failed("sender 1", "cannot connect to 127.0.0.1:5700: Connection refused")
    assert isinstance(second, Failed)
    assert second.reason.startswith("unexpected output from the C arrow: ")
