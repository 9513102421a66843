"""Graceful shutdown (issue 10 §8): SIGTERM stops accepting, closes every connection with
``amqp:connection:forced``, runs the shutdown hooks after the last connection, and exits 0 within
``shutdown_timeout`` even when clients never answer."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

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
