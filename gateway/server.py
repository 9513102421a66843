"""The server: one proton reactor, its listener, its queues, and a clean shutdown.

Everything runs on the reactor thread. Other threads (tests, signal handlers) reach it only
through :meth:`Server.call`, which runs a function there and waits for its result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import TypeVar

from proton import Condition

from sluicegate.gateway import runtime_vhosts
from sluicegate.gateway.broker import Broker
from sluicegate.gateway.collection import ReactorCollection
from sluicegate.gateway.config import ConfigError, ServerConfig
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.expiry import tick
from sluicegate.gateway.handover import Handovers
from sluicegate.gateway.http.api import HttpApi
from sluicegate.gateway.http.basic_auth import BasicAuth
from sluicegate.gateway.http.console import Console
from sluicegate.gateway.http.reactor_calls import ReactorCalls
from sluicegate.gateway.http.stack import HttpBounds, HttpStack
from sluicegate.gateway.listener import Listener, anonymous_allowed
from sluicegate.gateway.log_writer import FaultHook
from sluicegate.gateway.login import PasswordChecks
from sluicegate.gateway.metrics import SNAPSHOT_TIMEOUT, MetricsPages
from sluicegate.gateway.peers import Peers
from sluicegate.gateway.proton.internals import collector as proton_collector
from sluicegate.gateway.proton.io_layer import FlowIO
from sluicegate.gateway.proton.reactor import BrokerContainer
from sluicegate.gateway.rules.auth import ANONYMOUS_USER, DEFAULT_VHOST
from sluicegate.gateway.rules.definitions import apply_definitions
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.rules.vhost_log import VhostLog
from sluicegate.gateway.runtime_vhosts import RuntimeVhosts
from sluicegate.gateway.state import ConnectionState
from sluicegate.gateway.statistics import ServerStatistics, gathering, server_statistics
from sluicegate.gateway.supervisor import WorkerChannels, worker_index
from sluicegate.gateway.tls import server_context
from sluicegate.gateway.wakeup import Wakeup
from sluicegate.gateway.worker_metrics import fetch_pages, merge, peer_port_files, publish_port
from sluicegate.queues.registry import QueueRegistry

log = logging.getLogger("sluicegate")
T = TypeVar("T")


# How long select() may block: the longest a shutdown deadline can be overrun.
_SELECT_TIMEOUT = 0.5


class StartError(Exception):
    """The server cannot start; the message names the setting at fault."""


class Server:
    """An AMQP 1.0 server on one reactor."""

    def __init__(
        self,
        config: ServerConfig,
        storage_fault: FaultHook | None = None,
        channels: WorkerChannels | None = None,
    ) -> None:
        # Its own users table: grants to virtual hosts' creators change it (creator_grants.py).
        config = replace(config, users=dict(config.users))
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
        # Virtual hosts created through the HTTP API by an earlier run, and the configured ones.
        created = runtime_vhosts.load(config.data_dir)
        vhosts = {**created, **config.vhosts}
        # The default virtual host's registry; every virtual host's shares its clock and its
        # count of bytes held, for the memory budget.
        self.registry = QueueRegistry(store=VhostLog(store, DEFAULT_VHOST))
        registries = {
            name: self.registry
            if name == DEFAULT_VHOST
            else QueueRegistry(self.registry.clock, VhostLog(store, name), self.registry.held)
            for name in vhosts
        }
        self.durability.recover(registries)
        # A worker of several: from here on, a queue declared lives on its recorded home
        # (the log's own queues were recovered above: they live here).
        self.peers = None if channels is None else Peers(channels, registries)
        apply_definitions(registries, config.queues, config.exchanges, config.bindings)
        self.tenancy = Tenancy(
            vhosts,
            registries,
            config.max_application_properties_size,
            config.max_message_annotations_size,
            config.max_cc_keys,
            attach_declares_queues=config.attach_declares_queues,
        )
        # PLAIN password checks and tokens, on worker threads (gateway/login.py).
        self.logins = PasswordChecks(config.users, self._wakeup.call_soon, config.oauth2)
        self.broker = Broker(config, self.tenancy, self.durability, self.peers, logins=self.logins)
        self.runtime_vhosts = RuntimeVhosts(
            self.broker, store, config.data_dir, set(created) - set(config.vhosts)
        )
        self._io = FlowIO(self.broker)
        self.container = BrokerContainer(self.broker, self._io)
        self._listener: Listener | None = None
        # The metrics endpoint and the HTTP API (gateway/http/stack.py).
        self._http: HttpStack | None = None
        self._tls_listener: Listener | None = None
        # The amqps:// port once started, if TLS is configured.
        self.tls_port: int | None = None
        self._stopping = False
        # Set once the reactor has stopped serving, as the shutdown hooks start: a process
        # watchdog (cli/serve.py) waits for it.
        self.finishing = threading.Event()
        self._shutdown_hooks: list[Callable[[], None]] = []
        # The log writes and fsyncs the last settlements once no client can act any more.
        self.on_shutdown(self.durability.close)
        # What ``sluicegate serve`` exits with once :meth:`run` returns.
        self.exit_status = 0
        self._deadline = 0.0
        self.port = 0
        self.metrics_port = 0
        self.http_api_port = 0
        # The HTTP API, for the tests that read what it keeps per HTTP connection.
        self.http_api: HttpApi | None = None
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
        self._start_http()
        try:
            self._listener = Listener(self.container, config, self.broker, self.logins)
        except OSError as error:
            self._close_http()
            message = f"listen: cannot listen on {config.listen}: {error.strerror}"
            raise StartError(message) from None
        self.port = self._listener.port
        index = worker_index(config)
        if index is not None and config.worker_handover:
            try:
                handovers = Handovers(
                    index,
                    self.container,
                    self.broker,
                    config.max_pending_handovers,
                    declares=config.attach_declares_queues,
                )
            except OSError as error:
                # Its clients then cross as with worker_handover off; nothing else changes.
                log.warning("worker %d hands no connection over: %s", index, error.strerror)
            else:
                handovers.listener = self._listener
                self._listener.handovers = self.broker.handovers = handovers
        self._start_tls()
        self._wakeup.attach(self.container)
        self.durability.start()
        peers = self.peers
        if peers is not None:
            broker = self.broker
            peers.serve(
                self.tenancy,
                self.container,
                self.durability,
                broker.sending.route,
                broker.sending.delivered,
                broker.sending.replied,
                broker.links.refuse_consumer,
                broker.links.owner_took,
                broker.queue_deleted,
                broker.remote_consumer_left,
                config.max_message_size,
                config.max_queue_credit,
                broker.filter_views,
                self.runtime_vhosts,
                broker.sending.debt_of,
                broker.sending.hold,
                broker.publishing.flow,
                broker.sending.shorted,
            )

    def _start_http(self) -> None:
        """Open the metrics endpoint and the HTTP API, if configured, on one bounded stack."""
        config = self.config
        wanted = [
            (key, address)
            for key, address in (
                ("metrics_listen", config.metrics_address),
                ("http_api_listen", config.http_api_address),
            )
            if address is not None
        ]
        if not wanted:
            return
        stack = self._http = HttpStack()
        bounds = HttpBounds(
            config.http_max_connections, config.http_request_timeout, config.http_max_request_size
        )
        for key, (host, port) in wanted:
            calls = ReactorCalls(self.submit_in_turns)
            closed = None
            if key == "metrics_listen":
                handler = MetricsPages(partial(self._snapshot, calls), self._worker_peers()).handle
            else:
                api = self.http_api = self._api(calls, host)
                handler = Console(api.handle).handle
                closed = api.closed
            try:
                listening = stack.listen(host, port, handler, bounds, closed)
            except OSError as error:
                self._close_http()
                raise StartError(
                    f"{key}: cannot listen on {getattr(config, key)}: {error.strerror}"
                ) from None
            if key == "metrics_listen":
                self.metrics_port = listening.port
                if worker_index(config) not in (None, 0):
                    publish_port(config.data_dir, listening.port)
            else:
                self.http_api_port = listening.port

    def _worker_peers(self) -> Callable[[str, bytes], Awaitable[bytes]] | None:
        """For worker 0 of several, what adds the other workers' metrics to its own page."""
        config = self.config
        if worker_index(config) != 0:
            return None
        files = peer_port_files(config.data_dir, config.workers)

        async def add_peers(path: str, page: bytes) -> bytes:
            return merge([page, *await fetch_pages(files, path)], config.workers)

        return add_peers

    async def _snapshot(self, calls: ReactorCalls) -> ServerStatistics:
        return await calls.run(gathering(self.broker, self.tenancy), SNAPSHOT_TIMEOUT)

    def _api(self, calls: ReactorCalls, host: str) -> HttpApi:
        """The HTTP API on ``host``: without users, open without credentials only where an
        AMQP listener on that address would let anonymous clients in (loopback by default)."""
        config = self.config
        auth = BasicAuth(config.users, anonymous_allowed(config.anonymous_login, host))
        return HttpApi(
            self.broker,
            self.runtime_vhosts,
            calls,
            auth,
            node=self.broker.node,
            timeout=config.http_request_timeout,
            max_request_size=config.http_max_request_size,
            listing_delay=config.http_connection_listing_delay if config.rabbitmq_compatible else 0,
        )

    def _start_tls(self) -> None:
        """Open the amqps:// listener if a certificate and key are configured."""
        config = self.config
        try:
            tls = server_context(config)
        except ConfigError as error:
            self._close_http()
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
            self._close_http()
            message = f"tls_listen: cannot listen on {config.tls_listen}: {error.strerror}"
            raise StartError(message) from None
        self.tls_port = self._tls_listener.port

    def statistics(self) -> ServerStatistics:
        """Every queue's, session's and connection's counters; call on the reactor thread."""
        return server_statistics(self.broker, self.tenancy)

    def _close_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def run(self) -> None:
        """Serve until :meth:`shutdown` has closed every connection."""
        if self._listener is None:
            self.start()
        container = self.container
        container.timeout = _SELECT_TIMEOUT
        container.start()
        tick(self.registry)
        self.broker.expiry.start(container)
        self._collection = ReactorCollection()
        self.ready.set()
        while self._process():
            if self._stopping and time.monotonic() > self._deadline:
                log.warning("shutdown timed out: %d connections open", len(self.broker.connections))
                break
        container.stop()
        container.process()
        self.logins.close()
        self.finishing.set()
        self._run_shutdown_hooks()
        self._io.close()
        self._close_http()

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
        self._collection.run_due()
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
        try:
            return self.submit_in_turns(steps).result(timeout)
        except TimeoutError:
            raise TimeoutError("the reactor did not answer") from None

    def submit_in_turns(self, steps: Generator[None, None, T]) -> Future[T]:
        """:meth:`call_in_turns` without waiting: the future completes on the reactor thread.

        The HTTP listeners' loop awaits it (gateway/http/reactor_calls.py). A server that has
        stopped never completes it: callers wait with a timeout.
        """
        future: Future[T] = Future()

        def start() -> None:
            # An HTTP request that timed out or whose connection closed cancels its future
            # (gateway/http/reactor_calls.py): before the reactor takes the job, it is not run;
            # once running, it can no longer be cancelled and is done whole. Set on a cancelled
            # future, its result raised on the reactor (adversary seed 69502's internal error).
            if future.set_running_or_notify_cancel():
                step()

        def step() -> None:
            try:
                next(steps)
            except StopIteration as finished:
                future.set_result(finished.value)
            except BaseException as error:
                future.set_exception(error)
            else:
                self._wakeup.call_soon(step)

        self._wakeup.call_soon(start)
        return future

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
        if self.broker.handovers is not None:
            self.broker.handovers.close()
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
        if self.peers is not None:
            self.peers.close()
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
