"""The connector's options, parsed once and strictly.

Spark hands a data source its options as a loose, case-insensitive dict of strings, so a
misspelt ``maxRecordPerTrigger`` or a ``credit`` of ``"lots"`` would otherwise be silently
ignored (the complaint of Azure/azure-event-hubs-spark#677). Every option is checked here: an
unknown name, a value of the wrong type, or an option that does not apply to what is being done
raises :class:`OptionError` naming it, on the driver, before anything connects.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import SplitResult, urlsplit

# The default: a large window; the gateway hands its session at most 256 at a time, so
# the server stays safe, and the connector holds at most this many messages in memory.
DEFAULT_CREDIT: Final = 100_000
# Without a ``credit`` option, ``mode=queue`` grants at least this many ``maxRecordsPerTrigger``
# batches: one in Spark's hands, one ready for the next ``latestOffset``, one arriving. A batch's
# credit comes back only once Spark commits it; with a window of one batch the link idled while
# Spark processed it, and with two the third batch still arrived mostly after Spark asked for it
# (300,000 rows in batches of 100,000: 34.6 s with two, 19.1 s with three, same session).
PREFETCH_BATCHES: Final = 3
# Per connection attempt (TCP, TLS and the AMQP OPEN): a gateway on a loaded host answers in
# well under a second; ten seconds tells a hung one from a slow one.
DEFAULT_CONNECT_TIMEOUT_MS: Final = 10_000
# Attempts to open a connection, with back-off between them: a restarting gateway gets about 8 s
# of pauses, and a connection fails within connectTimeoutMs x connectAttempts (60 s) at worst.
DEFAULT_CONNECT_ATTEMPTS: Final = 6
# How long a bounded read (a browse, a stream range) waits for its next message before it
# decides the gateway has nothing more: Spark's own network timeout is 120 s.
DEFAULT_RECEIVE_TIMEOUT_MS: Final = 60_000
DEFAULT_SEND_TIMEOUT_MS: Final = 60_000
# A message the gateway releases is sent again this many times before the task fails.
DEFAULT_MAX_SEND_ATTEMPTS: Final = 5
AMQP_PORT: Final = 5672
# IANA's amqps port, the port of the gateway's ``tls_listen``.
AMQPS_PORT: Final = 5671


class OptionError(ValueError):
    """An option that is unknown, mistyped or does not apply; the message names it."""


class Mode(enum.Enum):
    """How a read consumes its address."""

    QUEUE = "queue"  # destructive, settled when Spark commits a micro-batch (streaming only)
    BROWSE = "browse"  # non-destructive copy of a queue (batch only)
    STREAM = "stream"  # offset ranges of a stream queue (batch and streaming)


class OffsetKind(enum.Enum):
    """Where a stream read starts or ends."""

    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest``, a stream offset, or a timestamp in milliseconds since 1970."""

    kind: OffsetKind
    value: int = 0

    @classmethod
    def parse(cls, name: str, text: str) -> OffsetSpec:
        """Read ``earliest``, ``latest``, an offset (``42``) or an ISO-8601 timestamp."""
        word = text.strip().lower()
        if word in ("earliest", "latest"):
            return cls(OffsetKind(word))
        if word.isdigit():
            return cls(OffsetKind.OFFSET, int(word))
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise OptionError(
                f"option {name}: expected earliest, latest, an offset or an ISO-8601 "
                f"timestamp with a time zone, got {text!r}"
            ) from None
        if moment.tzinfo is None:
            raise OptionError(f"option {name}: the timestamp {text!r} needs a time zone")
        return cls(OffsetKind.TIMESTAMP, int(moment.timestamp() * 1000))


class Secret:
    """A password that never shows itself: not in a repr, a str, a log line or an error.

    It pickles as it is, since the executors that open connections need it; Spark ships the
    reader to them over its own worker pipes.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The password itself, for the one place that sends it (SASL PLAIN)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return (Secret, (self._value,))


@dataclass(frozen=True, slots=True)
class Credentials:
    """A SASL PLAIN login (RFC 4616): the gateway checks it against its ``[users]``."""

    username: str
    password: Secret


@dataclass(frozen=True, slots=True)
class Tls:
    """How the gateway's certificate is checked.

    ``ca_file`` None trusts the system's CA bundle; ``verify_hostname`` False still checks the
    chain but accepts a certificate issued for another name.
    """

    ca_file: str | None
    verify_hostname: bool


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the gateway listens, how to log in, and what to attach to.

    ``credentials`` None logs in with SASL ANONYMOUS; ``tls`` None speaks plain TCP.
    """

    host: str
    port: int
    address: str
    connect_timeout_s: float
    connect_attempts: int
    credentials: Credentials | None = None
    tls: Tls | None = None

    @property
    def url(self) -> str:
        """``amqp[s]://HOST:PORT`` for messages: never the user name or password."""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"{'amqps' if self.tls else 'amqp'}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Everything a read needs, validated."""

    endpoint: Endpoint
    mode: Mode
    credit: int
    max_records_per_trigger: int | None
    max_bytes_per_trigger: int | None
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    # None: Spark's default parallelism (``spark.source.register`` records it).
    min_partitions: int | None
    receive_timeout_s: float
    # A missing queue fails the read (True) or reads as empty until it appears (False).
    fail_on_missing: bool = True
    # An offset retention removed before it was read fails the query (True) or is skipped.
    fail_on_data_loss: bool = True


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Everything a sink needs, validated."""

    endpoint: Endpoint
    send_timeout_s: float
    max_send_attempts: int
    # The header's durable flag: a durable queue keeps durable messages across restarts.
    durable: bool = True


_COMMON: Final = (
    "url",
    "address",
    "connectTimeoutMs",
    "connectAttempts",
    "username",
    "password",
    "tls",
    "tlsCaFile",
    "tlsVerifyHostname",
)
_TRUE: Final = frozenset({"true", "yes", "1", "on"})
_FALSE: Final = frozenset({"false", "no", "0", "off"})
_READ: Final = (
    "mode",
    "credit",
    "maxRecordsPerTrigger",
    "maxBytesPerTrigger",
    "startingOffsets",
    "endingOffsets",
    "minPartitions",
    "receiveTimeoutMs",
    "failOnMissing",
    "failOnDataLoss",
)
_WRITE: Final = ("sendTimeoutMs", "maxSendAttempts", "durable")
# Spark's own option for a streaming write, which it passes on to the sink with the user's.
_SPARK_STREAM_WRITE: Final = ("checkpointLocation",)
# Options that only make sense for one kind of read; given to another, they are an error.
_ONLY_FOR: Final[dict[str, frozenset[tuple[Mode, bool]]]] = {
    "credit": frozenset({(Mode.QUEUE, True)}),
    "maxRecordsPerTrigger": frozenset({(Mode.QUEUE, True), (Mode.STREAM, True)}),
    "maxBytesPerTrigger": frozenset({(Mode.QUEUE, True), (Mode.STREAM, True)}),
    "startingOffsets": frozenset({(Mode.STREAM, True), (Mode.STREAM, False)}),
    "endingOffsets": frozenset({(Mode.STREAM, False)}),
    "minPartitions": frozenset({(Mode.QUEUE, True), (Mode.STREAM, True), (Mode.STREAM, False)}),
    "failOnDataLoss": frozenset({(Mode.STREAM, True), (Mode.STREAM, False)}),
    "receiveTimeoutMs": frozenset(
        {(Mode.BROWSE, False), (Mode.STREAM, True), (Mode.STREAM, False)}
    ),
}


class _Options:
    """A case-insensitive view of the user's options that remembers which were used."""

    def __init__(self, raw: Mapping[str, str], allowed: tuple[str, ...], what: str) -> None:
        canonical = {name.lower(): name for name in allowed}
        self.values: dict[str, str] = {}
        for key, value in raw.items():
            name = canonical.get(key.lower())
            if name is None:
                known = ", ".join(sorted(allowed))
                raise OptionError(f"unknown option {key!r} for a sluicegate {what}; known: {known}")
            self.values[name] = value

    def text(self, name: str) -> str | None:
        return self.values.get(name)

    def required(self, name: str) -> str:
        value = self.values.get(name)
        if value is None or not value.strip():
            raise OptionError(f"option {name} is required")
        return value.strip()

    def integer(self, name: str, default: int | None, minimum: int) -> int | None:
        text = self.values.get(name)
        if text is None:
            return default
        try:
            value = int(text.strip())
        except ValueError:
            raise OptionError(f"option {name}: expected an integer, got {text!r}") from None
        if value < minimum:
            raise OptionError(f"option {name}: must be at least {minimum}, got {value}")
        return value

    def boolean(self, name: str) -> bool | None:
        text = self.values.get(name)
        if text is None:
            return None
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise OptionError(f"option {name}: expected true or false, got {text!r}")

    def positive(self, name: str, default: int) -> int:
        value = self.integer(name, default, 1)
        assert value is not None
        return value


def _url(options: _Options) -> tuple[SplitResult, bool]:
    """The parsed ``url`` and whether its scheme asks for TLS.

    The message of an error never repeats a URL that carries a password.
    """
    url = options.required("url")
    parts = urlsplit(url)
    shown = (
        repr(url) if parts.password is None else "the URL given (not repeated: it holds a password)"
    )
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise OptionError(f"option url: expected amqp[s]://HOST[:PORT], got {shown}")
    if parts.username is not None or parts.password is not None:
        raise OptionError(
            f"option url: {shown} carries a user name or password; give them in options "
            "username and password, which Spark redacts from its plans"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise OptionError(
            f"option url: {shown} carries more than amqp[s]://HOST[:PORT]; "
            "give the queue in option address"
        )
    return parts, parts.scheme == "amqps"


def _tls(options: _Options, scheme_tls: bool) -> Tls | None:
    flag = options.boolean("tls")
    if scheme_tls and flag is False:
        raise OptionError("option tls: false contradicts option url's amqps:// scheme")
    if not (scheme_tls or flag):
        for name in ("tlsCaFile", "tlsVerifyHostname"):
            if name in options.values:
                raise OptionError(
                    f"option {name} applies only with TLS (an amqps:// url or tls=true)"
                )
        return None
    ca_file = options.text("tlsCaFile")
    if ca_file is not None and not ca_file.strip():
        raise OptionError("option tlsCaFile: expected the path of a PEM CA bundle, got ''")
    verify = options.boolean("tlsVerifyHostname")
    return Tls(
        ca_file=None if ca_file is None else ca_file.strip(),
        verify_hostname=True if verify is None else verify,
    )


def _credentials(options: _Options) -> Credentials | None:
    username = options.text("username")
    password = options.text("password")
    if username is None and password is None:
        return None
    if username is None or not username:
        raise OptionError("option username is required with option password")
    if password is None:
        raise OptionError(f"option password is required with option username ({username!r})")
    if "\0" in username or "\0" in password:
        # RFC 4616 separates the fields with NUL: one inside would change what is sent.
        raise OptionError("options username and password may not contain a NUL character")
    return Credentials(username, Secret(password))


def _endpoint(options: _Options) -> Endpoint:
    parts, scheme_tls = _url(options)
    tls = _tls(options, scheme_tls)
    try:
        port = parts.port or (AMQPS_PORT if tls else AMQP_PORT)
    except ValueError:
        raise OptionError(f"option url: bad port in {parts.geturl()!r}") from None
    assert parts.hostname is not None
    return Endpoint(
        host=parts.hostname,
        port=port,
        address=options.required("address"),
        connect_timeout_s=options.positive("connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS) / 1000,
        connect_attempts=options.positive("connectAttempts", DEFAULT_CONNECT_ATTEMPTS),
        credentials=_credentials(options),
        tls=tls,
    )


def parse_read_options(raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Validate a read's options; ``streaming`` tells ``readStream`` from ``read``."""
    what = "streaming read" if streaming else "batch read"
    options = _Options(raw, _COMMON + _READ, what)
    endpoint = _endpoint(options)
    mode_text = (options.text("mode") or ("queue" if streaming else "browse")).strip().lower()
    try:
        mode = Mode(mode_text)
    except ValueError:
        raise OptionError(
            f"option mode: expected queue, browse or stream, got {options.text('mode')!r}"
        ) from None
    if mode is Mode.QUEUE and not streaming:
        raise OptionError(
            "option mode: queue consumes destructively and a batch read has no commit to "
            "settle on; use mode=browse (a non-destructive copy) or a streaming read"
        )
    if mode is Mode.BROWSE and streaming:
        raise OptionError("option mode: browse is a batch read; stream a queue with mode=queue")
    for name, modes in _ONLY_FOR.items():
        if name in options.values and (mode, streaming) not in modes:
            raise OptionError(f"option {name} does not apply to a {mode.value} {what}")
    starting = options.text("startingOffsets")
    ending = options.text("endingOffsets")
    max_records = options.integer("maxRecordsPerTrigger", None, 1)
    default_credit = max(DEFAULT_CREDIT, PREFETCH_BATCHES * (max_records or 0))
    return ReadOptions(
        endpoint=endpoint,
        mode=mode,
        credit=options.positive("credit", default_credit),
        max_records_per_trigger=max_records,
        max_bytes_per_trigger=options.integer("maxBytesPerTrigger", None, 1),
        starting_offsets=(
            OffsetSpec.parse("startingOffsets", starting)
            if starting is not None
            else OffsetSpec(OffsetKind.LATEST if streaming else OffsetKind.EARLIEST)
        ),
        ending_offsets=(
            OffsetSpec.parse("endingOffsets", ending)
            if ending is not None
            else OffsetSpec(OffsetKind.LATEST)
        ),
        min_partitions=options.integer("minPartitions", None, 1),
        receive_timeout_s=options.positive("receiveTimeoutMs", DEFAULT_RECEIVE_TIMEOUT_MS) / 1000,
        fail_on_missing=options.boolean("failOnMissing") is not False,
        fail_on_data_loss=options.boolean("failOnDataLoss") is not False,
    )


def parse_write_options(raw: Mapping[str, str], *, streaming: bool) -> WriteOptions:
    """Validate a sink's options (a streaming one also gets Spark's ``checkpointLocation``)."""
    allowed = _COMMON + _WRITE + (_SPARK_STREAM_WRITE if streaming else ())
    options = _Options(raw, allowed, "streaming write" if streaming else "write")
    return WriteOptions(
        endpoint=_endpoint(options),
        send_timeout_s=options.positive("sendTimeoutMs", DEFAULT_SEND_TIMEOUT_MS) / 1000,
        max_send_attempts=options.positive("maxSendAttempts", DEFAULT_MAX_SEND_ATTEMPTS),
        durable=options.boolean("durable") is not False,
    )
