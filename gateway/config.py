"""Server configuration: embedded defaults, then a TOML file, then ``SLUICEGATE_*``, then flags.

Every key is validated once, here, so that a bad value stops the server with one line naming
the key and the problem instead of failing later inside the reactor.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sluicegate.gateway.oauth2 import OAuth2Settings, parse_oauth2
from sluicegate.gateway.rules.auth import User, UserError, parse_users
from sluicegate.gateway.rules.credit_hold import DEFAULT_ATTACH_CREDIT_HOLD
from sluicegate.gateway.rules.definitions import (
    BindingDefinition,
    DefinitionError,
    ExchangeDefinition,
    QueueDefinition,
    check_definitions,
    parse_definitions,
)
from sluicegate.gateway.rules.routing import (
    DEFAULT_MAX_APPLICATION_PROPERTIES_SIZE,
    DEFAULT_MAX_CC_KEYS,
    DEFAULT_MAX_MESSAGE_ANNOTATIONS_SIZE,
)
from sluicegate.gateway.rules.vhosts import VhostSettings, default_vhosts, parse_vhosts
from sluicegate.queues.log.bodies import DEFAULT_CACHE_BYTES
from sluicegate.queues.log.placement import DEFAULT_SEGMENT_SIZE, MAX_SEGMENT_SIZE
from sluicegate.session.account import DEFAULT_ACCOUNT_LIMIT
from sluicegate.session.memory_budget import DEFAULT_MEMORY_BUDGET
from sluicegate.session.outbound import DEFAULT_MAX_QUEUE_CREDIT
from sluicegate.session.waiting import DEFAULT_MAX_OUTGOING_PENDING
from sluicegate.writer.credit import DEFAULT_INITIAL_CREDIT, DEFAULT_MORE_CREDIT_AFTER

# RabbitMQ's DEFAULT_MAX_LINK_CREDIT: 170 * 1.5 = 255 stays below the queue batch of 256.
DEFAULT_MAX_LINK_CREDIT: Final = 170
# RabbitMQ's default max_message_size is 16 MiB; a Python server copies each message once more,
# so it keeps half of that.
DEFAULT_MAX_MESSAGE_SIZE: Final = 8 * 1024 * 1024
# max_unfinished_size 0: two messages of the largest size may be arriving at once.
UNFINISHED_MESSAGES: Final = 2
# max_unfinished_total_size 0: a quarter of the memory budget. Bytes still arriving are bytes
# no consumer can drain; the other three quarters stay for messages that can be consumed.
UNFINISHED_BUDGET_SHARE: Final = 4
# max_endpoints_size 0: a quarter of the memory budget, beside it, as the server's RSS bound
# counts it (docs/operations.md): 128 MiB, some 5,000 connections of a few links each, at the
# default budget.
ENDPOINTS_BUDGET_SHARE: Final = 4
# The oldest delivery still arriving is always read: one that makes no progress while the cap is
# reached keeps every other multi-frame publisher released. A minute is far more than any client
# sending a message needs between two frames, as the idle timeout's default is.
DEFAULT_UNFINISHED_TIMEOUT: Final = 60.0
# Bytes a connection's writer hands to proton before it waits for the socket: a few frames of
# the largest size in flight, whatever frame size the client announces (docs/operations.md).
DEFAULT_WRITER_BUFFER_SIZE: Final = 4 * 1024 * 1024
# Proton's and RabbitMQ's default: large enough to batch small messages, small enough that one
# frame never blocks a connection's other sessions for long.
DEFAULT_MAX_FRAME_SIZE: Final = 128 * 1024
# AMQP 1.0 §2.7.1: no peer may announce less.
MIN_MAX_FRAME_SIZE: Final = 512
ENV_PREFIX: Final = "SLUICEGATE_"
# RabbitMQ's Prometheus port, so existing scrape configs and dashboards find sluicegate.
DEFAULT_METRICS_LISTEN: Final = "127.0.0.1:15692"
# Values of metrics_listen and http_api_listen that turn the listener off.
METRICS_OFF: Final = frozenset({"", "off", "none", "false"})
# RabbitMQ's management port, where rabbitmqadmin, curl scripts and client test suites look.
DEFAULT_HTTP_API_LISTEN: Final = "127.0.0.1:15672"
# Sockets each HTTP listener (metrics, API) may hold: a few scrapers and admin tools need a
# handful; two listeners at 64 keep HTTP far below the 1,024 descriptors of a default ulimit,
# whatever clients do, so the AMQP listener always has its share (docs/http-api.md).
DEFAULT_HTTP_MAX_CONNECTIONS: Final = 64
# Seconds for a request head to arrive (from the connection or the previous response), its
# body to arrive and its answer to be made: a real client needs milliseconds, a slowloris
# client is cut off after this.
DEFAULT_HTTP_REQUEST_TIMEOUT: Final = 10.0
# Request bodies are small JSON maps (a queue's arguments, a binding): nothing the API takes
# needs more, and 64 connections reading one each hold at most 4 MiB.
DEFAULT_HTTP_MAX_REQUEST_SIZE: Final = 64 * 1024
# RabbitMQ's HTTP API lists a connection from its statistics collector's next run, 0 to 5 s
# (collect_statistics_interval) after it opened; 2.5 s, the mean, answers a client the same
# every time whether it relies on a fresh connection not being listed or a 5 s old one being
# listed (docs/http-api.md).
DEFAULT_HTTP_CONNECTION_LISTING_DELAY: Final = 2.5
# Worker processes one supervisor may start (gateway/supervisor.py): past any core count this
# runs on, and a typo such as 1000 is refused rather than a thousand servers forked.
MAX_WORKERS: Final = 256
# RabbitMQ 4's defaults: 64 sessions per connection, 256 links per session.
DEFAULT_CHANNEL_MAX: Final = 63
DEFAULT_MAX_LINKS_PER_SESSION: Final = 256
# ATTACH data per connection: 16,384 links (64 sessions of 256) of 512 bytes, four times what
# proton's and RabbitMQ's clients send for a link to a queue, filters included.
DEFAULT_MAX_ATTACH_DATA_SIZE: Final = 8 * 1024 * 1024
# RabbitMQ's heartbeat default; a dead peer behind a silent network is found within a minute.
DEFAULT_IDLE_TIMEOUT: Final = 60.0
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
# RabbitMQ's tcp_listen_options.send_timeout: a client that reads nothing for that long while
# output waits for it is dropped; a consumer that reads, however slowly, moves its output on.
DEFAULT_SEND_TIMEOUT: Final = 15.0
# Sockets still in their handshake at once: more than a burst of real clients reconnecting after
# a restart ever keeps in flight (each handshake takes milliseconds), and at a few KiB each far
# below what would matter; sockets that never log in hold a place for handshake_timeout.
DEFAULT_MAX_UNAUTHENTICATED_CONNECTIONS: Final = 1024
# PLAIN logins waiting for their password check, per listener and per client address. Two
# workers check about 30 logins a second on a small machine, so 64 wait at most about 2 s; 8
# per address leave room for a host that opens a pool of connections at once.
DEFAULT_MAX_PENDING_LOGINS: Final = 64
DEFAULT_MAX_PENDING_LOGINS_PER_ADDRESS: Final = 8
# Connections a worker may have offered to other workers and not had an answer for, and (apart)
# offered to it and not taken yet (gateway/handover.py). One takes a worker well under a
# millisecond unless a PLAIN password is checked; a burst beyond it keeps its workers and
# crosses, so 16 is plenty and bounds the descriptors and bytes held (64 KiB each).
DEFAULT_MAX_PENDING_HANDOVERS: Final = 16
ANONYMOUS_LOGIN: Final = ("loopback", "on", "off")

# Field types (as annotated) that a single command-line flag can carry.
_SCALAR_KINDS: Final = frozenset({"int", "float", "str", "bool", "Path"})
_TRUE: Final = frozenset({"true", "yes", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "off", "0"})
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?|B)?\s*$", re.IGNORECASE)


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything the server needs to start; the defaults are the embedded default."""

    listen: str = "127.0.0.1:5672"
    data_dir: Path = field(default_factory=lambda: Path("sluicegate-data"))
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # Encoded bytes of a message's application-properties section; larger is rejected.
    max_application_properties_size: int = DEFAULT_MAX_APPLICATION_PROPERTIES_SIZE
    # Encoded bytes of a message's (or a modified outcome's) message-annotations; larger is
    # refused.
    max_message_annotations_size: int = DEFAULT_MAX_MESSAGE_ANNOTATIONS_SIZE
    # Distinct routing keys one message's x-cc may name; more is rejected.
    max_cc_keys: int = DEFAULT_MAX_CC_KEYS
    # Bytes of multi-frame deliveries still arriving on one connection; past it, it is closed.
    # 0: twice max_message_size.
    max_unfinished_size: int = 0
    # Bytes of multi-frame deliveries still arriving on all connections together; past it,
    # connections with one arriving are not read (but for the oldest). 0: memory_budget / 4.
    max_unfinished_total_size: int = 0
    # Seconds the oldest delivery still arriving may go without a byte while those bytes are at
    # max_unfinished_total_size; then its connection is closed. 0: no deadline.
    unfinished_timeout: float = DEFAULT_UNFINISHED_TIMEOUT
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_link_credit: int = DEFAULT_MAX_LINK_CREDIT
    max_queue_credit: int = DEFAULT_MAX_QUEUE_CREDIT
    # Bytes of deliveries waiting in one connection's sessions at which they stop asking queues
    # for more (session/waiting.py).
    max_outgoing_pending_size: int = DEFAULT_MAX_OUTGOING_PENDING
    # Bytes of message bodies all queues may hold in memory before publishers are blocked.
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    # Routed copies a connection may have in flight (not yet stored) before its reads pause.
    account_limit: int = DEFAULT_ACCOUNT_LIMIT
    writer_initial_credit: int = DEFAULT_INITIAL_CREDIT
    writer_more_credit_after: int = DEFAULT_MORE_CREDIT_AFTER
    # Bytes one connection's writer may have handed to proton and not yet written.
    writer_buffer_size: int = DEFAULT_WRITER_BUFFER_SIZE
    shutdown_timeout: float = 5.0
    # Worker processes, each a reactor with its own log in <data_dir>/worker-K, clients spread
    # over them on one port (docs/workers.md); 1 keeps the single process.
    workers: int = 1
    # With workers > 1: a plain connection whose first link names another worker's queue is
    # handed to that worker (docs/workers.md#handing-a-connection-over), and how many such
    # hand-overs each worker may have under way, given and taken each.
    worker_handover: bool = True
    max_pending_handovers: int = DEFAULT_MAX_PENDING_HANDOVERS
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    # RabbitMQ's HTTP API (docs/http-api.md), HOST:PORT or "off".
    http_api_listen: str = DEFAULT_HTTP_API_LISTEN
    # Bounds of each HTTP listener, metrics and API alike (gateway/http/stack.py).
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    http_request_timeout: float = DEFAULT_HTTP_REQUEST_TIMEOUT
    http_max_request_size: int = DEFAULT_HTTP_MAX_REQUEST_SIZE
    # Seconds a connection is open before the HTTP API lists it, with rabbitmq_compatible on
    # (as RabbitMQ's statistics collector; docs/http-api.md); 0 lists it at once.
    http_connection_listing_delay: float = DEFAULT_HTTP_CONNECTION_LISTING_DELAY
    # -- authentication, TLS and limits (docs/operations.md) --
    # Users from the config file's [users.NAME] tables; see gateway/rules/auth.py.
    # One table for the whole run: gateway/creator_grants.py changes entries in place.
    users: dict[str, User] = field(default_factory=dict)
    # OAuth 2 access tokens accepted as PLAIN passwords (gateway/oauth2.py); TOML only.
    oauth2: OAuth2Settings | None = None
    # Virtual hosts from the [vhosts.NAME] tables, the default one "/" always among them.
    vhosts: Mapping[str, VhostSettings] = field(default_factory=default_vhosts)
    # Who may log in without a password: "loopback" (only on a loopback listener), "on", "off".
    anonymous_login: str = "loopback"
    # The amqps:// listener; it opens only when a certificate and key are configured.
    tls_listen: str = "127.0.0.1:5671"
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # CA certificates client certificates must chain to (SASL EXTERNAL); none: not asked for.
    tls_ca_file: Path | None = None
    tls_fail_if_no_peer_cert: bool = False
    # 0: no limit (RabbitMQ's default too); over it a connection is closed at OPEN. Only
    # connections that have sent their OPEN count.
    max_connections: int = 0
    # Connections that have not finished TLS, SASL and OPEN yet, counted apart so that they
    # cannot fill max_connections; over it a new socket is closed at once. 0: no limit.
    max_unauthenticated_connections: int = DEFAULT_MAX_UNAUTHENTICATED_CONNECTIONS
    # Highest channel number, so channel_max + 1 sessions (RabbitMQ 4: 64 sessions).
    channel_max: int = DEFAULT_CHANNEL_MAX
    # RabbitMQ 4's link_max_per_session.
    max_links_per_session: int = DEFAULT_MAX_LINKS_PER_SESSION
    # Bytes of ATTACH data (names, termini, filters, properties) one connection's links may
    # make the server hold; an ATTACH past it is refused (gateway/limits.py).
    max_attach_data_size: int = DEFAULT_MAX_ATTACH_DATA_SIZE
    # Bytes all connections, sessions and links (ATTACH data included) may make the server
    # hold together (session/endpoint_memory.py); 0: a quarter of memory_budget.
    max_endpoints_size: int = 0
    # PLAIN logins waiting for their password check on one listener, and from one address;
    # over either, a login gets SASL sys-temp at once (gateway/login.py).
    max_pending_logins: int = DEFAULT_MAX_PENDING_LOGINS
    max_pending_logins_per_address: int = DEFAULT_MAX_PENDING_LOGINS_PER_ADDRESS
    # Seconds a client has from connecting to its OPEN, TLS and SASL included (RabbitMQ's
    # handshake_timeout): a socket that never logs in and opens is dropped.
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    # Seconds without a frame from the client before it is dropped; 0 disables. Proton sends
    # our heartbeats at half the client's own idle-time-out.
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    # Seconds a connection's output may wait without any of it reaching the socket before the
    # client is dropped (no CLOSE reaches a client that reads nothing); 0 disables.
    send_timeout: float = DEFAULT_SEND_TIMEOUT
    # Advertise product "RabbitMQ" in OPEN, which RabbitMQ's AMQP 1.0 clients require, and let
    # clients repeat link names as RabbitMQ does (gateway/feeding.py).
    rabbitmq_compatible: bool = True
    # Attaching a publisher or consumer to /queues/NAME declares NAME when it does not exist;
    # false refuses the link with amqp:not-found, as RabbitMQ 4 does (its clients' suites
    # expect that refusal).
    attach_declares_queues: bool = True
    # Seconds credit granted with a consumer's ATTACH waits, once the reply is written, for the
    # client's next frame before it counts (gateway/rules/credit_hold.py); 0: it counts at once.
    attach_credit_hold: float = DEFAULT_ATTACH_CREDIT_HOLD
    # Declared at start, in this order (gateway/rules/definitions.py): [[queues]], [[exchanges]],
    # [[bindings]] tables of the configuration file.
    queues: tuple[QueueDefinition, ...] = ()
    exchanges: tuple[ExchangeDefinition, ...] = ()
    bindings: tuple[BindingDefinition, ...] = ()
    # The durable log: size of one segment file, and bodies kept in memory after their fsync.
    log_segment_size: int = DEFAULT_SEGMENT_SIZE
    body_cache_size: int = DEFAULT_CACHE_BYTES

    def __post_init__(self) -> None:
        try:
            check_definitions(self.queues, self.exchanges, self.bindings, self.vhosts)
        except DefinitionError as error:
            raise ConfigError(str(error)) from None
        _check_host_port("listen", self.listen)
        for key in ("metrics_listen", "http_api_listen"):
            if getattr(self, key).lower() not in METRICS_OFF:
                _check_host_port(key, getattr(self, key))
        for key in ("http_max_connections", "http_request_timeout", "http_max_request_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: must be positive, got {getattr(self, key)}")
        for key in ("http_connection_listing_delay", "attach_credit_hold"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must not be negative")
        for key in (
            "max_message_size",
            "max_application_properties_size",
            "max_message_annotations_size",
            "max_cc_keys",
            "max_attach_data_size",
            "max_link_credit",
            "max_queue_credit",
            "max_outgoing_pending_size",
            "memory_budget",
            "account_limit",
            "log_segment_size",
            "writer_buffer_size",
        ):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: must be positive, got {getattr(self, key)}")
        if 0 < self.max_unfinished_size < self.max_message_size:
            raise ConfigError(
                "max_unfinished_size: must be 0 or at least max_message_size, or no message of "
                "that size could arrive"
            )
        if not 0 <= self.max_unfinished_total_size <= self.memory_budget:
            raise ConfigError(
                "max_unfinished_total_size: must be 0 (a quarter of memory_budget) or at most "
                "memory_budget"
            )
        if self.max_endpoints_size < 0:
            raise ConfigError("max_endpoints_size: must be 0 (a quarter of memory_budget) or more")
        if self.unfinished_timeout < 0:
            raise ConfigError("unfinished_timeout: must be 0 (no deadline) or positive")
        if self.log_segment_size > MAX_SEGMENT_SIZE:
            raise ConfigError(f"log_segment_size: must be at most {MAX_SEGMENT_SIZE}")
        if self.max_frame_size < MIN_MAX_FRAME_SIZE:
            raise ConfigError(f"max_frame_size: must be at least {MIN_MAX_FRAME_SIZE}")
        if not 0 < self.writer_more_credit_after <= self.writer_initial_credit:
            raise ConfigError(
                "writer_more_credit_after: must be positive and at most writer_initial_credit"
            )
        if self.shutdown_timeout <= 0:
            raise ConfigError("shutdown_timeout: must be positive")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"workers: must be 1 to {MAX_WORKERS}, got {self.workers}")
        self._check_security()

    def _check_security(self) -> None:
        if self.anonymous_login not in ANONYMOUS_LOGIN:
            raise ConfigError(
                f"anonymous_login: expected one of {', '.join(ANONYMOUS_LOGIN)}, "
                f"got {self.anonymous_login!r}"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("tls_key_file: tls_cert_file and tls_key_file go together")
        for key in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
            path: Path | None = getattr(self, key)
            if path is not None and not path.is_file():
                raise ConfigError(f"{key}: no such file {str(path)!r}")
        _check_host_port("tls_listen", self.tls_listen)
        if not 0 <= self.channel_max <= 65535:
            raise ConfigError(f"channel_max: must be 0 to 65535, got {self.channel_max}")
        for key in (
            "max_connections",
            "max_unauthenticated_connections",
            "idle_timeout",
            "send_timeout",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must be 0 (no limit) or positive")
        if self.handshake_timeout <= 0:
            raise ConfigError("handshake_timeout: must be positive")
        for key in (
            "max_links_per_session",
            "max_pending_logins",
            "max_pending_logins_per_address",
            "max_pending_handovers",
        ):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: must be positive")
        if self.body_cache_size < 0:
            raise ConfigError("body_cache_size: must not be negative")
        for user in self.users.values():
            for vhost in user.vhosts:
                if vhost not in self.vhosts:
                    raise ConfigError(
                        f"users.{user.name}.permissions.{vhost}: no virtual host {vhost!r} "
                        f"(declare it with a [vhosts.{vhost}] table)"
                    )

    @property
    def unfinished_limit(self) -> int:
        """Bytes of deliveries still arriving one connection may have (``max_unfinished_size``)."""
        return self.max_unfinished_size or UNFINISHED_MESSAGES * self.max_message_size

    @property
    def unfinished_total_limit(self) -> int:
        """Bytes of deliveries still arriving all connections may have together."""
        return self.max_unfinished_total_size or self.memory_budget // UNFINISHED_BUDGET_SHARE

    @property
    def endpoints_limit(self) -> int:
        """Bytes all clients' connections, sessions and links may make the server hold."""
        return self.max_endpoints_size or self.memory_budget // ENDPOINTS_BUDGET_SHARE

    @property
    def host(self) -> str:
        """The address to listen on."""
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        """The port to listen on; 0 picks a free one."""
        return int(self.listen.rpartition(":")[2])

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """Where Prometheus scrapes, or None when the endpoint is off."""
        return _address(self.metrics_listen)

    @property
    def http_api_address(self) -> tuple[str, int] | None:
        """Where RabbitMQ's HTTP API listens, or None when it is off."""
        return _address(self.http_api_listen)


def _address(listen: str) -> tuple[str, int] | None:
    if listen.lower() in METRICS_OFF:
        return None
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def _check_host_port(key: str, value: str) -> None:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")


def parse_size(key: str, raw: object) -> int:
    """Read a byte size: an integer, or a string such as ``64MiB``, ``512k`` or ``1GB``."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    match = _SIZE.match(str(raw))
    if not match:
        raise ConfigError(f"{key}: expected a size such as 65536 or 64MiB, got {raw!r}")
    number, unit = match.groups()
    unit = (unit or "").lower()
    base = 1024 if "i" in unit else 1000
    scale = {"": 1, "b": 1}.get(unit) or base ** ("kmg".index(unit[0]) + 1)
    return int(number) * scale


def _coerce(key: str, kind: object, raw: object) -> object:
    if key in ("queues", "exchanges", "bindings"):
        try:
            return parse_definitions(key, raw)
        except DefinitionError as error:
            raise ConfigError(str(error)) from None
    if kind == "int":
        if key.endswith("_size") or key == "memory_budget":
            return parse_size(key, raw)
        try:
            return int(str(raw))
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
    if kind == "float":
        try:
            return float(str(raw))
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {raw!r}") from None
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ConfigError(f"{key}: expected true or false, got {raw!r}")
    if kind in ("Path", "Path | None"):
        return Path(str(raw))
    if key in ("users", "vhosts", "oauth2"):
        try:
            if key == "oauth2":
                return parse_oauth2(raw)
            return parse_users(raw) if key == "users" else parse_vhosts(raw)
        except UserError as error:
            raise ConfigError(str(error)) from None
    return str(raw)


def setting_names(*, scalar: bool = False) -> list[str]:
    """Every key a configuration file may set, in declaration order.

    ``scalar`` keeps the keys whose value fits in one flag or environment variable.
    """
    fields = dataclasses.fields(ServerConfig)
    return [f.name for f in fields if not scalar or f.type in _SCALAR_KINDS]


def load_config(
    file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> ServerConfig:
    """Merge the embedded defaults with a TOML file, the environment and CLI overrides."""
    kinds = {f.name: f.type for f in dataclasses.fields(ServerConfig)}
    values: dict[str, object] = {}
    if file is not None:
        try:
            table = tomllib.loads(file.read_text())
        except OSError as exc:
            raise ConfigError(f"config: cannot read {file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {file} is not valid TOML: {exc}") from None
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in kinds:
                raise ConfigError(f"{key}: unknown key in {file}")
            values[name] = raw
    env = os.environ if environ is None else environ
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in kinds:
            raise ConfigError(f"{key}: unknown setting")
        values[name] = raw
    values.update({name: raw for name, raw in (overrides or {}).items() if raw is not None})
    coerced = {name: _coerce(name, kinds[name], raw) for name, raw in values.items()}
    try:
        return ServerConfig(**coerced)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
