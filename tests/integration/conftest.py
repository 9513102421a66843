"""A real sluicegate server on 127.0.0.1 for integration tests, in a thread of the test process.

Running it in-process lets tests read the server's ``statistics()`` white-box, the way
RabbitMQ's suites call ``rabbit_queue_type:stat/1`` over RPC: always on the reactor thread,
through :meth:`gateway.server.Server.call`.
"""

from __future__ import annotations

import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from support.certificates import self_signed

from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.log_writer import FaultHook
from sluicegate.gateway.server import Server
from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.session.outbound import SessionStatistics
from sluicegate.transport.channel import client_context

T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration as an integration test."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


@dataclass
class RunningServer:
    """A started server and the ways tests reach it."""

    server: Server
    thread: threading.Thread
    host: str = "127.0.0.1"
    # A temporary data directory this fixture made, removed when the server stops.
    owned_data_dir: Path | None = None

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self.server.port

    @property
    def url(self) -> str:
        """``amqp://127.0.0.1:PORT``."""
        return f"amqp://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where the server's Prometheus endpoint listens."""
        return f"http://{self.host}:{self.server.metrics_port}/metrics"

    @property
    def api_url(self) -> str:
        """Where the server's HTTP API listens: ``http://127.0.0.1:PORT/api``."""
        return f"http://{self.host}:{self.server.http_api_port}/api"

    def call(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the reactor thread."""
        return self.server.call(function)

    def queue(self, name: str) -> QueueStatistics:
        """A queue's counts; the queue must exist."""

        def read() -> QueueStatistics:
            queue = self.server.registry.get(name)
            assert queue is not None, f"no queue {name!r}"
            return queue.statistics()

        return self.call(read)

    def sessions(self) -> list[SessionStatistics]:
        """The outbound statistics of every open session."""

        def read() -> list[SessionStatistics]:
            return [
                session.pure.statistics()
                for connection in self.server.broker.connections
                for session in connection.sessions.values()
            ]

        return self.call(read)

    def stop(self) -> None:
        """Shut down gracefully and wait for the reactor thread to end."""
        self.server.request_shutdown()
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the server did not shut down"
        if self.owned_data_dir is not None:
            shutil.rmtree(self.owned_data_dir, ignore_errors=True)


def start_server(storage_fault: FaultHook | None = None, **settings: object) -> RunningServer:
    """Start a server on a free loopback port with ``settings`` over the defaults.

    Without a ``data_dir`` setting each server gets its own temporary one, removed at stop.
    The HTTP API lists connections as soon as they open, unless a test asks for RabbitMQ's
    delay (tests/integration/test_connection_listing.py).
    """
    settings.setdefault("metrics_listen", "127.0.0.1:0")
    settings.setdefault("http_api_listen", "127.0.0.1:0")
    settings.setdefault("http_connection_listing_delay", 0.0)
    owned = None
    if "data_dir" not in settings:
        owned = settings["data_dir"] = Path(tempfile.mkdtemp(prefix="sluicegate-test-"))
    config = ServerConfig(listen="127.0.0.1:0", **settings)  # type: ignore[arg-type]
    server = Server(config, storage_fault)
    server.start()
    thread = threading.Thread(target=server.run, name="sluicegate-reactor", daemon=True)
    thread.start()
    server.ready.wait(5)
    return RunningServer(server, thread, owned_data_dir=owned)


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    """One server shared by the tests that use distinct queue names."""
    running = start_server()
    yield running
    running.stop()


@pytest.fixture
def make_server() -> Iterator[Callable[..., RunningServer]]:
    """Start servers with their own settings; each is stopped after the test."""
    started: list[RunningServer] = []

    def make(storage_fault: FaultHook | None = None, **settings: object) -> RunningServer:
        running = start_server(storage_fault, **settings)
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()


@dataclass(frozen=True)
class Scheme:
    """How a test's client reaches the server: amqp://, or amqps:// through the TLS gate."""

    # The certificate and key of the amqps:// listener; None for amqp://.
    certificate: tuple[Path, Path] | None
    # What the client trusts (the certificate itself); None for amqp://.
    tls: ssl.SSLContext | None

    @property
    def settings(self) -> dict[str, object]:
        """What ``make_server`` needs on top of a test's own settings."""
        if self.certificate is None:
            return {}
        cert, key = self.certificate
        return {"tls_cert_file": cert, "tls_key_file": key, "tls_listen": "127.0.0.1:0"}

    def port(self, running: RunningServer) -> int:
        """The port of the listener this scheme names."""
        if self.certificate is None:
            return running.port
        assert running.server.tls_port is not None
        return running.server.tls_port


# Over TLS each attack takes as long again; the quick run keeps the plain path, CI runs both.
@pytest.fixture(params=["amqp", pytest.param("amqps", marks=pytest.mark.slow)])
def scheme(request: pytest.FixtureRequest, tmp_path: Path) -> Scheme:
    """Each test that takes it runs over plain TCP and over TLS."""
    if request.param == "amqp":
        return Scheme(None, None)
    cert, key = self_signed(tmp_path, "localhost", "DNS:localhost,IP:127.0.0.1")
    return Scheme((cert, key), client_context(str(cert), verify_hostname=True))
