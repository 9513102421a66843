"""The configuration bench.peer_suites starts sluicegate with for RabbitMQ's client suites."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import peer_suites
from bench.peer_suites import config_text
from sluicegate.gateway.config import load_config

# The part of RabbitMQ's advanced.config the suites' CI gives its broker.
ADVANCED = """[
  {rabbitmq_auth_backend_oauth2, [{key_config,
         [{signing_keys,
              #{<<"token-key">> =>
                    {map,
                        #{<<"alg">> => <<"HS256">>,
                          <<"k">> => <<"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH">>,
                          <<"kid">> => <<"token-key">>,
                          <<"kty">> => <<"oct">>}}}}]},
     {resource_server_id,<<"rabbitmq">>}]}
]."""


@pytest.mark.parametrize(("kind", "where"), [("go", ".ci/ubuntu"), ("js", "conf")])
def test_the_config_loads_with_the_suites_users_and_oauth2_key(
    tmp_path: Path, kind: str, where: str
) -> None:
    (tmp_path / where).mkdir(parents=True)
    (tmp_path / where / "advanced.config").write_text(ADVANCED)
    path = tmp_path / "sluicegate.toml"
    path.write_text(config_text(tmp_path, kind))
    config = load_config(path, environ={})
    assert config.oauth2 is not None
    assert config.oauth2.resource_server_id == "rabbitmq"
    assert set(config.oauth2.keys) == {"token-key"}
    assert {"guest", "user_1", "anonymous"} <= set(config.users)
    assert ("test-user" in config.users) is (kind == "js")
    assert config.users["O=client,CN=localhost"].password is None
    assert config.http_api_listen == "127.0.0.1:15672"
    assert not config.attach_declares_queues


def test_without_an_advanced_config_there_are_no_tokens(tmp_path: Path) -> None:
    path = tmp_path / "sluicegate.toml"
    path.write_text(config_text(tmp_path, "python"))
    assert load_config(path, environ={}).oauth2 is None


def test_the_python_suite_option_may_follow_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--python`` after the positionals, before ``--``: the arguments still reach the suite."""
    calls: list[tuple[object, ...]] = []

    def run(*args: object) -> int:
        calls.append(args)
        return 0

    monkeypatch.setattr(peer_suites, "run", run)
    argv = ["python", "/tmp/x", "--python", "/venv/python", "--", "-q", "-k", "stream"]
    assert peer_suites.main(argv) == 0
    assert calls == [("python", Path("/tmp/x"), ["-q", "-k", "stream"], "/venv/python")]
