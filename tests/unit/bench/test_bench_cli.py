"""The bench's choice of servers and the figures it draws from sampled runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main, targets_from
from bench.scenarios.memory_budget import publisher_figures
from bench.scenarios.slow_consumer import consumer_figures
from bench.series import Series
from bench.servers import START, Target, external


def test_default_target_is_a_started_sluicegate() -> None:
    assert targets_from(None, None, []) == [Target("sluicegate", START)]


def test_url_with_pid() -> None:
    assert targets_from("amqp://127.0.0.1:5674", None, ["123"]) == [
        Target("server", "amqp://127.0.0.1:5674", 123)
    ]


def test_compare_with_named_pids() -> None:
    targets = targets_from(
        None,
        ["sluicegate=start", "rabbitmq=amqp://127.0.0.1:5672/queue/"],
        ["rabbitmq=4242"],
    )
    assert targets == [
        Target("sluicegate", START),
        Target("rabbitmq", "amqp://127.0.0.1:5672/queue/", 4242),
    ]


@pytest.mark.parametrize(
    ("url", "compare", "pids"),
    [
        (None, ["a=start", "a=start"], []),
        (None, ["a"], []),
        (None, ["a=http://x/"], []),
        (None, ["a=start"], ["b=1"]),
        (None, ["a=start"], ["1"]),
        ("amqp://h", None, ["a=1"]),
        (None, None, ["1"]),
        ("amqp://h", None, ["x"]),
    ],
)
def test_bad_server_choices(url: str | None, compare: list[str] | None, pids: list[str]) -> None:
    with pytest.raises(ValueError, match=r"."):
        targets_from(url, compare, pids)


def test_bad_choice_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["throughput", "--compare", "a=start", "a=start"]) == 2
    assert capsys.readouterr().err == "python -m bench throughput: --compare names must differ\n"


def test_address_prefix_from_the_url() -> None:
    rabbit = external(Target("rabbitmq", "amqp://127.0.0.1:5672/queue/"))
    assert rabbit.address("q") == "/queue/q"
    assert rabbit.url("q") == "amqp://127.0.0.1:5672/queue/q"
    plain = external(Target("naive", "amqp://127.0.0.1:5674"))
    assert plain.address("q") == "/queues/q"
    assert plain.url("q") == "amqp://127.0.0.1:5674/queues/q"


def test_slow_consumer_figures_split_at_the_fill() -> None:
    rss = [(0.0, 30.0), (1.0, 60.0), (2.0, 64.0), (3.0, 62.0)]
    pending = [(1.5, 200.0), (2.5, 257.0)]
    series = {
        "server RSS": Series("server RSS", "MB", rss),
        "outgoing_pending max": Series("outgoing_pending max", "deliveries", pending),
    }
    figures = consumer_figures(series, filled_at=1.0, stored_mb=20.0, taken=1000, duration=2.0)
    assert figures["RSS empty MB"] == 30.0
    assert figures["RSS filled MB"] == 60.0
    assert figures["RSS peak MB"] == 64.0
    assert figures["RSS end MB"] == 62.0
    assert figures["growth MB"] == 4.0
    assert figures["pending max"] == 257.0
    assert figures["consumer msg/s"] == 500.0


def test_slow_consumer_figures_without_samples() -> None:
    figures = consumer_figures({}, filled_at=1.0, stored_mb=20.0, taken=0, duration=2.0)
    assert figures["RSS peak MB"] is None
    assert figures["pending max"] is None


def test_publisher_figures() -> None:
    rss = [(0.0, 30.0), (1.0, 90.0), (2.0, 94.0), (3.0, 94.0), (4.0, 94.0)]
    sent = [(0.0, 0.0), (1.0, 100.0), (2.0, 100.0), (4.0, 100.0), (9.0, 100.0)]
    series = {
        "server RSS": Series("server RSS", "MB", rss),
        "publisher sent": Series("publisher sent", "messages", sent),
    }
    figures = publisher_figures(series, sent=100, accepted=100, taken=40, publishing=(0.0, 4.0))
    assert figures["RSS peak MB"] == 94.0
    assert figures["slope 2nd half MB/s"] == 0.0
    assert figures["publisher blocked s"] == 3.0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["adversary", "--steps", "5"], "--steps needs --seed"),
        (["adversary", "--only", "no-such-action"], "unknown actions ['no-such-action']"),
    ],
)
def test_adversary_usage_errors(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([*argv, "--output", str(tmp_path)]) == 2
    assert says in capsys.readouterr().err
