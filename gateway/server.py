"""The server: one proton reactor, its listener, its queues, and a clean shutdown.

Everything runs on the reactor thread. Other threads (tests, signal handlers) reach it only
through :meth:`Server.call`, which runs a function there and waits for its result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import TypeVar

from proton import Condition

from sluicegate.gateway.auth import ANONYMOUS_USER, DEFAULT_VHOST
from sluicegate.gateway.broker import Broker
from sluicegate.gateway.config import ConfigError, ServerConfig
from sluicegate.gateway.definitions import apply_definitions
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.expiry import tick
from sluicegate.gateway.io_layer import FlowIO
from sluicegate.gateway.listener import Listener
from sluicegate.gateway.log_writer import FaultHook
from sluicegate.gateway.login import PasswordChecks
from sluicegate.gateway.metrics import SNAPSHOT_TIMEOUT, MetricsEndpoint
from sluicegate.gateway.proton_internals import collector as proton_collector
from sluicegate.gateway.reactor import BrokerContainer
from sluicegate.gateway.state import ConnectionState
from sluicegate.gateway.statistics import ServerStatistics, gathering, server_statistics
from sluicegate.gateway.tenancy import Tenancy
from sluicegate.gateway.tls import server_context
from sluicegate.gateway.vhost_log import VhostLog
from sluicegate.gateway.wakeup import Wakeup
from sluicegate.queues.registry import QueueRegistry

log = logging.getLogger("sluicegate")
T = TypeVar("T")


# How long select() may block: the longest a shutdown deadline can be overrun.
_SELECT_TIMEOUT = 0.5


class StartError(Exception):
    """The server cannot start; the message names the setting at fault."""


class Server:
    """An AMQP 1.0 server on one reactor."""

    def __init__(self, config: ServerConfig, storage_fault: FaultHook | None = None) -> None:
        self.config = config
        self._wakeup = Wakeup()
        self.durability = Durability(
            config.data_dir,
            self._wakeup,
            segment_size=config.log_segment_size,
            cache_bytes=config.body_cache_size,
            fault=storage_fault,
        )
        store = self.durability.store
        # The default virtual host's registry; every virtual host's shares its clock and its
        # count of bytes held, for the memory budget.
        self.registry = QueueRegistry(store=VhostLog(store, DEFAULT_VHOST))
        registries = {
            name: self.registry
            if name == DEFAULT_VHOST
            else QueueRegistry(self.registry.clock, VhostLog(store, name), self.registry.held)
            for name in config.vhosts
        }
        self.durability.recover(registries)
        apply_definitions(registries, config.queues, config.exchanges, config.bindings)
        self.tenancy = Tenancy(
            config.vhosts,
            registries,
            config.max_application_properties_size,
            attach_declares_queues=config.attach_declares_queues,
        )
        self.broker = Broker(config, self.tenancy, self.durability)
        self.container = BrokerContainer(self.broker)
        self._io = FlowIO(self.broker)
        self.container.global_handler = self._io
        # PLAIN password checks, on worker threads (gateway/login.py).
        self.logins = PasswordChecks(config.users, self._wakeup.call_soon)
        self._listener: Listener | None = None
        self._metrics: MetricsEndpoint | None = None
        self._tls_listener: Listener | None = None
        # The amqps:// port once started, if TLS is configured.
        self.tls_port: int | None = None
        self._stopping = False
        self._shutdown_hooks: list[Callable[[], None]] = []
        # The log writes and fsyncs the last settlements once no client can act any more.
        self.on_shutdown(self.durability.close)
        # What ``sluicegate serve`` exits with once :meth:`run` returns.
        self.exit_status = 0
        self._deadline = 0.0
        self.port = 0
        self.metrics_port = 0
        self.ready = threading.Event()

    def start(self) -> None:
        """Open the listening sockets; after this, :attr:`port` is the real port.

        Raises :class:`StartError` naming the setting whose address cannot be used.
        """
        config = self.config
        if config.anonymous_login == "on" and config.users and ANONYMOUS_USER not in config.users:
            log.warning(
                "anonymous_login is on, but users are configured and [users.anonymous] is not: "
                "anonymous logins are refused"
            )
        metrics = config.metrics_address
        if metrics is not None:
            try:
                self._metrics = MetricsEndpoint(*metrics, self._scrape)
            except OSError as error:
                raise StartError(
                    f"metrics_listen: cannot listen on {config.metrics_listen}: {error.strerror}"
                ) from None
            self.metrics_port = self._metrics.port
        try:
            self._listener = Listener(self.container, config, self.broker, self.logins)
        except OSError as error:
            self._close_metrics()
            message = f"listen: cannot listen on {config.listen}: {error.strerror}"
            raise StartError(message) from None
        self.port = self._listener.port
        self._start_tls()
        self._wakeup.attach(self.container)
        self.durability.start()

    def _start_tls(self) -> None:
        """Open the amqps:// listener if a certificate and key are configured."""
        config = self.config
        try:
            tls = server_context(config)
        except ConfigError as error:
            self._close_metrics()
            raise StartError(str(error)) from None
        if tls is None:
            return
        host, _, port = config.tls_listen.rpartition(":")
        try:
            self._tls_listener = Listener(
                self.container,
                config,
                self.broker,
                self.logins,
                address=(host.strip("[]"), int(port)),
                tls=tls,
            )
        except OSError as error:
            self._close_metrics()
            message = f"tls_listen: cannot listen on {config.tls_listen}: {error.strerror}"
            raise StartError(message) from None
        self.tls_port = self._tls_listener.port

    def statistics(self) -> ServerStatistics:
        """Every queue's, session's and connection's counters; call on the reactor thread."""
        return server_statistics(self.broker, self.tenancy)

    def _scrape(self) -> ServerStatistics:
        return self.call_in_turns(gathering(self.broker, self.tenancy), timeout=SNAPSHOT_TIMEOUT)

    def _close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def run(self) -> None:
        """Serve until :meth:`shutdown` has closed every connection."""
        if self._listener is None:
            self.start()
        container = self.container
        container.timeout = _SELECT_TIMEOUT
        container.start()
        tick(self.registry)
        self.broker.expiry.start(container)
        self.ready.set()
        while self._process():
            if self._stopping and time.monotonic() > self._deadline:
                log.warning("shutdown timed out: %d connections open", len(self.broker.connections))
                break
        container.stop()
        container.process()
        self.logins.close()
        self._run_shutdown_hooks()
        self._io.close()
        self._close_metrics()

    def on_shutdown(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on the reactor thread once every connection is closed, before exit.

        This is where durable storage writes and syncs what it still holds: no client can
        publish any more, and what a hook does not make durable here is lost. A hook that
        raises makes :attr:`exit_status` 1, so a process supervisor sees the failure.
        """
        self._shutdown_hooks.append(hook)

    def _run_shutdown_hooks(self) -> None:
        for hook in self._shutdown_hooks:
            try:
                hook()
            except Exception:
                log.exception("a shutdown hook failed; durable data may be incomplete")
                self.exit_status = 1

    def _process(self) -> bool:
        """Run the reactor once; a failure while handling one connection closes only that one."""
        tick(self.registry)
        try:
            return self.container.process()
        except Exception:
            log.exception("internal error while handling an event")
            self._contain_failure()
            return True

    def _contain_failure(self) -> None:
        # The event being dispatched is still at the head of the collector: proton pops it
        # only after every handler has run.
        collector = proton_collector(self.container)
        event = collector.peek()
        if event is None:
            return
        collector.pop()
        connection = event.connection
        state: ConnectionState | None = getattr(connection, "sg", None)
        if state is not None and not state.closed:
            self.broker.release_connection(state)
            connection_ = state.connection
            connection_.condition = Condition("amqp:internal-error", "the server failed")
            connection_.close()

    def call(self, function: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``function`` on the reactor thread and return its result."""
        return self.call_in_turns(_at_once(function), timeout)

    def call_in_turns(self, steps: Generator[None, None, T], timeout: float = 10.0) -> T:
        """Run ``steps`` on the reactor thread, one step per turn, and return what it returns.

        Between two steps the reactor serves its clients, so a long job (a metrics snapshot
        of many queues) never holds it for more than one step.
        """
        done = threading.Event()
        result: list[T] = []
        failure: list[BaseException] = []

        def step() -> None:
            try:
                next(steps)
            except StopIteration as finished:
                result.append(finished.value)
            except BaseException as error:
                failure.append(error)
            else:
                self._wakeup.call_soon(step)
                return
            done.set()

        self._wakeup.call_soon(step)
        if not done.wait(timeout):
            raise TimeoutError("the reactor did not answer")
        if failure:
            raise failure[0]
        return result[0]

    def request_shutdown(self) -> None:
        """Ask for a graceful shutdown; safe from signal handlers and other threads."""
        if self._stopping:
            return  # under way or done: the wakeup pipe may be closed already
        self._wakeup.call_soon(self._shutdown)

    def _shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for listener in (self._listener, self._tls_listener):
            if listener is not None:
                listener.close()
        self.logins.close()
        for state in list(self.broker.connections):
            if state.user is None:
                # Still logging in: proton has no AMQP connection to close, so drop the socket.
                self.broker.release_connection(state)
                state.transport.close_tail()
                state.transport.close_head()
                continue
            self._force_close(state)
        self.broker.flush()
        self._wakeup.detach()
        self.broker.expiry.stop()
        self._deadline = time.monotonic() + self.config.shutdown_timeout

    def _force_close(self, state: ConnectionState) -> None:
        self.broker.release_connection(state)
        connection = state.connection
        connection.condition = Condition("amqp:connection:forced", "the server is shutting down")
        connection.close()


def _at_once(function: Callable[[], T]) -> Generator[None, None, T]:
    """``function`` as a job of a single step."""
    yield from ()
    return function()
