"""Graceful shutdown (issue 10 §8): SIGTERM stops accepting, closes every connection with
``amqp:connection:forced``, runs the shutdown hooks after the last connection, and exits 0 within
``shutdown_timeout`` even when clients never answer."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import Message
from support.frames import SASL_HEADER
from support.process import serving
from support.raw_client import RawClient

SHUTDOWN_TIMEOUT = 2.0


@pytest.mark.slow
def test_sigterm_with_busy_silent_and_half_logged_in_clients_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "SLUICEGATE_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT)}
    options = ("--data-dir", str(tmp_path), "--metrics-listen", "off")
    with contextlib.ExitStack() as stack:
        process, port = stack.enter_context(serving(*options, env=env))
        # A publisher and a consumer with links attached, and a client that will not read.
        busy = stack.enter_context(RawClient.connect("127.0.0.1", port))
        busy.begin()
        publisher = busy.attach("p", "sender", target="/queues/stop")
        consumer = busy.attach("c", "receiver", source="/queues/stop")
        busy.wait_credit(publisher)
        delivery = busy.send(publisher, Message(body="kept").encode())
        busy.wait_outcomes([delivery])
        busy.wait_attach(consumer)
        silent = stack.enter_context(RawClient.connect("127.0.0.1", port))
        half = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
        half.sendall(SASL_HEADER)
        assert half.recv(8) == SASL_HEADER

        process.send_signal(signal.SIGTERM)
        close = busy.wait_for("close", timeout=10)
        assert close["error"]["condition"] == "amqp:connection:forced"
        # The silent client never answers CLOSE; the server waits shutdown_timeout, no more.
        assert process.wait(timeout=SHUTDOWN_TIMEOUT + 20) == 0
        assert silent.wait_for("close")["error"]["condition"] == "amqp:connection:forced"
        while half.recv(65536):
            pass  # the half-logged-in client is dropped: EOF


def test_shutdown_hooks_run_once_after_every_connection_closed(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server()
    seen: list[tuple[int, str]] = []

    def hook() -> None:
        connections = len(running.server.broker.connections)
        seen.append((connections, threading.current_thread().name))

    running.server.on_shutdown(hook)
    client = RawClient.connect(running.host, running.port)
    with client:
        client.begin()
        running.server.request_shutdown()
        assert client.wait_for("close")["error"]["condition"] == "amqp:connection:forced"
        client.close()
        running.thread.join(timeout=30)
    assert seen == [(0, "sluicegate-reactor")]
    assert running.server.exit_status == 0


def test_a_failing_shutdown_hook_makes_the_exit_status_1(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server()

    def broken() -> None:
        raise OSError(28, "No space left on device")

    running.server.on_shutdown(broken)
    running.server.request_shutdown()
    running.thread.join(timeout=30)
    assert running.server.exit_status == 1


# A server whose reactor loops for ever once serving (its expiry timer never returns): how a
# dead-letter loop held it before issue 31's fixes, when SIGTERM did nothing and only SIGKILL
# ended it.
_STUCK_SERVER: Final = """
import sys
from sluicegate.gateway.expiry import ExpiryTimer
from sluicegate.cli.main import main

def stuck(self, event):
    while True:
        pass

ExpiryTimer.on_timer_task = stuck
sys.exit(main(["serve", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_sigterm_ends_a_server_whose_reactor_is_stuck_within_its_shutdown_timeout(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "SLUICEGATE_SHUTDOWN_TIMEOUT": "1"}
    options = ("--data-dir", str(tmp_path), "--metrics-listen", "off")
    command = (sys.executable, "-c", _STUCK_SERVER)
    with serving(*options, command=command, env=env) as (process, _):
        time.sleep(0.5)
        assert process.poll() is None
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        # shutdown_timeout (1 s) and the watchdog's margin (1 s); generous for a busy machine.
        assert process.wait(timeout=15) == 1
        took = time.monotonic() - sent
        assert process.stderr is not None
        assert "did not stop within shutdown_timeout" in process.stderr.read()
    assert took >= 1.0
