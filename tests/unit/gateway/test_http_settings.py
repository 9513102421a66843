"""The HTTP listeners' settings: validated once, with one line naming the key."""

from __future__ import annotations

import pytest

from sluicegate.gateway.config import ConfigError, ServerConfig, load_config


def test_defaults_and_off() -> None:
    config = ServerConfig()
    assert config.http_api_address == ("127.0.0.1", 15672)
    assert ServerConfig(http_api_listen="off").http_api_address is None
    assert load_config(
        environ={"SLUICEGATE_HTTP_MAX_REQUEST_SIZE": "8KiB"}
    ).http_max_request_size == (8 * 1024)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"http_api_listen": "nowhere"}, "http_api_listen: expected HOST:PORT, got 'nowhere'"),
        ({"http_max_connections": 0}, "http_max_connections: must be positive, got 0"),
        ({"http_request_timeout": -1.0}, "http_request_timeout: must be positive, got -1.0"),
        ({"http_max_request_size": 0}, "http_max_request_size: must be positive, got 0"),
        (
            {"http_connection_listing_delay": -1.0},
            "http_connection_listing_delay: must not be negative",
        ),
    ],
)
def test_bad_values_name_the_key(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        ServerConfig(**settings)  # type: ignore[arg-type]
    assert str(raised.value) == message
