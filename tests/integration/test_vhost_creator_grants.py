"""The user who creates a virtual host over the HTTP API gets every permission in it, as
RabbitMQ's ``put_vhost`` grants (RabbitMQ's Python client's suite creates one as guest and
connects to it at once); the grant survives a restart and goes with the virtual host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from integration.conftest import RunningServer, start_server
from integration.test_http_api import PASSWORD, call
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from sluicegate.gateway.rules.auth import hash_password, parse_users
from sluicegate.gateway.runtime_vhosts import FILE_NAME


def _server(data_dir: Path) -> RunningServer:
    hashed = hash_password(PASSWORD)
    admin = {"password_hash": hashed, "tags": ["administrator"]}
    return start_server(data_dir=data_dir, users=parse_users({"root": admin, "ops": admin}))


def _send(running: RunningServer, user: str, vhost: str) -> None:
    """Log in as ``user`` with PLAIN in ``vhost`` and publish; raises if the login is refused."""
    connection = BlockingConnection(
        running.url,
        timeout=10,
        user=user,
        password=PASSWORD,
        allowed_mechs="PLAIN",
        virtual_host=f"vhost:{vhost}",
    )
    try:
        connection.create_sender("/queues/granted").send(Message(body=user))
    finally:
        connection.close()


def test_the_creator_of_a_vhost_may_use_it_at_once_and_after_a_restart(tmp_path: Path) -> None:
    running = _server(tmp_path)
    try:
        assert call(running, "PUT", "/vhosts/made", {}, user="root")[0] == 201
        _send(running, "root", "made")
        # Over HTTP too, with the credentials it created the vhost with (remembered before).
        assert call(running, "GET", "/queues/made/granted", user="root")[1]["messages"] == 1
        # Another administrator was granted nothing, and a second PUT grants nothing either.
        assert call(running, "PUT", "/vhosts/made", {}, user="ops")[0] == 204
        with pytest.raises(ConnectionException):
            _send(running, "ops", "made")
    finally:
        running.stop()
    entries = json.loads((tmp_path / FILE_NAME).read_text())
    assert entries == [{"name": "made", "granted": ["root"]}]
    running = _server(tmp_path)
    try:
        _send(running, "root", "made")
        # Deleted, the grant goes; made again by another, the grant is the other's.
        assert call(running, "DELETE", "/vhosts/made", user="root")[0] == 204
        assert call(running, "PUT", "/vhosts/made", {}, user="ops")[0] == 201
        _send(running, "ops", "made")
        with pytest.raises(ConnectionException):
            _send(running, "root", "made")
        permissions = call(running, "GET", "/users/root/permissions", user="root")[1]
        assert "made" not in [entry["vhost"] for entry in permissions]
    finally:
        running.stop()


def test_a_file_of_bare_names_still_loads(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text(json.dumps(["older"]))
    running = _server(tmp_path)
    try:
        assert running.call(lambda: "older" in running.server.tenancy.vhosts)
        with pytest.raises(ConnectionException):
            _send(running, "root", "older")
    finally:
        running.stop()
