"""Configuration: precedence of the four sources, value checks, and the documentation of keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.gateway.config import ConfigError, ServerConfig, load_config, setting_names

DOCS = Path(__file__).parents[3] / "docs" / "configuration.md"


def test_every_key_is_documented() -> None:
    text = DOCS.read_text()
    missing = [name for name in setting_names() if f"| `{name}` |" not in text]
    assert missing == []


def test_later_sources_win(tmp_path: Path) -> None:
    file = tmp_path / "sluicegate.toml"
    file.write_text('max-link-credit = 10\nmax_queue_credit = 20\nlisten = "127.0.0.1:1"\n')
    config = load_config(
        file,
        environ={"SLUICEGATE_MAX_QUEUE_CREDIT": "30", "SLUICEGATE_LISTEN": "127.0.0.1:2"},
        overrides={"listen": "127.0.0.1:3", "max_message_size": None},
    )
    assert config.max_link_credit == 10
    assert config.max_queue_credit == 30
    assert config.listen == "127.0.0.1:3"
    assert config.max_message_size == ServerConfig().max_message_size


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("65536", 65536), ("64KiB", 65536), ("64k", 64000), ("1 MiB", 1 << 20), ("2G", 2 * 10**9)],
)
def test_sizes(raw: str, expected: int) -> None:
    assert load_config(environ={"SLUICEGATE_MAX_MESSAGE_SIZE": raw}).max_message_size == expected


@pytest.mark.parametrize(
    ("raw", "address"),
    [
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("[::1]:0", ("::1", 0)),
        ("off", None),
        ("", None),
        ("OFF", None),
    ],
)
def test_metrics_listen(raw: str, address: tuple[str, int] | None) -> None:
    config = load_config(environ={}, overrides={"metrics_listen": raw})
    assert config.metrics_address == address


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SLUICEGATE_MAX_FRAME_SIZE": "huge"}, "max_frame_size: expected a size"),
        ({"SLUICEGATE_MAX_FRAME_SIZE": "100"}, "max_frame_size: must be at least 512"),
        ({"SLUICEGATE_MAX_LINK_CREDIT": "-3"}, "max_link_credit: must be positive, got -3"),
        ({"SLUICEGATE_SHUTDOWN_TIMEOUT": "soon"}, "shutdown_timeout: expected a number"),
        ({"SLUICEGATE_METRICS_LISTEN": "15692"}, "metrics_listen: expected HOST:PORT"),
        ({"SLUICEGATE_LISTEN": "host:99999"}, "listen: expected HOST:PORT"),
        ({"SLUICEGATE_COLOUR": "blue"}, "SLUICEGATE_COLOUR: unknown setting"),
    ],
)
def test_bad_values_name_the_key(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    file = tmp_path / "broken.toml"
    file.write_text("listen = \n")
    with pytest.raises(ConfigError, match=r"^config: .*broken.toml is not valid TOML"):
        load_config(file, environ={})
    with pytest.raises(ConfigError, match=r"^config: cannot read .*absent.toml"):
        load_config(tmp_path / "absent.toml", environ={})
