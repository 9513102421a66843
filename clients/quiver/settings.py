"""What one ``sluicegate quiver`` run measures, and what each sender and receiver process is told.

Plain frozen values, checked once, so the processes (started with ``spawn``) get picklable
instructions and the statistics can describe the run without touching argparse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from sluicegate.clients.quiver.endpoint import Endpoint

__all__ = [
    "DEFAULT_BODY_SIZE",
    "DEFAULT_COUNT",
    "DEFAULT_CREDIT",
    "DEFAULT_TIMEOUT",
    "IMPLS",
    "STAMP_SIZE",
    "ArrowConfig",
    "Impl",
    "Role",
    "Settings",
    "SettingsError",
    "plan_arrows",
    "shares",
]

# 10-20 s through 5k-10k msg/s servers (docs/benchmarks.md): long enough to smooth out start-up,
# short enough for a quick look; --duration is there for steady states.
DEFAULT_COUNT: Final[int] = 100_000
DEFAULT_BODY_SIZE: Final[int] = 100  # quiver's default, and the size in docs/benchmarks.md
DEFAULT_CREDIT: Final[int] = 1000  # quiver's default credit window
DEFAULT_TIMEOUT: Final[float] = 10.0  # seconds without progress: a server paused that long is stuck
STAMP_SIZE: Final[int] = 8  # the send time, big-endian int64 nanoseconds, opens every body

Role = Literal["sender", "receiver"]
Impl = Literal["python", "c"]  # the arrows' language: Python over proton's engine, or C
IMPLS: Final[tuple[Impl, ...]] = ("python", "c")


class SettingsError(ValueError):
    """The options contradict each other or cannot be measured."""


@dataclass(frozen=True, slots=True)
class Settings:
    """One run: where, how many (``count``) or how long (``duration``), and how."""

    url: str
    endpoint: Endpoint
    count: int | None
    duration: float | None
    body_size: int = DEFAULT_BODY_SIZE
    credit: int = DEFAULT_CREDIT
    durable: bool = False
    presettled: bool = False
    timeout: float = DEFAULT_TIMEOUT
    senders: int = 1
    receivers: int = 1
    peer_to_peer: bool = False
    output: str | None = None
    json_summary: bool = False
    impl: Impl = "python"

    def __post_init__(self) -> None:
        if (self.count is None) == (self.duration is None):
            raise SettingsError("give exactly one of --count and --duration")
        if self.count is not None and self.count < 1:
            raise SettingsError("--count must be at least 1")
        if self.duration is not None and self.duration <= 0:
            raise SettingsError("--duration must be positive")
        if self.body_size < STAMP_SIZE:
            raise SettingsError(f"--body-size must be at least {STAMP_SIZE} (the send-time stamp)")
        if self.credit < 1:
            raise SettingsError("--credit must be at least 1")
        if self.timeout <= 0:
            raise SettingsError("--timeout must be positive")
        if self.senders < 1 or self.receivers < 1:
            raise SettingsError("--senders and --receivers must be at least 1")
        if self.count is not None and self.count < self.senders:
            raise SettingsError("--count must be at least --senders (each sender sends)")
        if self.peer_to_peer and self.senders != self.receivers:
            raise SettingsError("--peer-to-peer pairs senders with receivers: give as many of each")
        if self.peer_to_peer and self.impl == "c":
            raise SettingsError("--impl c connects to a server: it has no --peer-to-peer")
        if self.peer_to_peer and self.endpoint.port + self.receivers - 1 > 65535:
            raise SettingsError("--peer-to-peer needs one port per receiver above the URL's port")

    @property
    def flags(self) -> tuple[str, ...]:
        """The switches that change what is measured, in quiver's wording."""
        named = (
            ("durable", self.durable),
            ("presettled", self.presettled),
            ("peer-to-peer", self.peer_to_peer),
        )
        return tuple(name for name, on in named if on)


@dataclass(frozen=True, slots=True)
class ArrowConfig:
    """What one sender or receiver process does (quiver calls these processes arrows)."""

    role: Role
    index: int
    host: str
    port: int
    address: str
    listen: bool
    count: int | None
    duration: float | None
    body_size: int
    credit: int
    durable: bool
    presettled: bool
    not_before_ns: int
    timeout: float

    @property
    def name(self) -> str:
        """``sender 1``, ``receiver 2``: how errors and status rows name this process."""
        return f"{self.role} {self.index}"

    @property
    def host_port(self) -> str:
        """Where this process connects or listens, for messages."""
        return Endpoint(self.host, self.port, self.address).host_port


def shares(total: int, parts: int) -> list[int]:
    """Split ``total`` messages over ``parts`` senders, the first ones taking the remainder."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def plan_arrows(settings: Settings, start_ns: int) -> tuple[list[ArrowConfig], list[ArrowConfig]]:
    """Give each sender its share of the count and each receiver the most it may take.

    Peer to peer, receiver i listens on the URL's port + i and sender i connects to it.
    Receivers take messages stamped before ``start_ns`` (wall clock) for an earlier run's.
    """
    endpoint = settings.endpoint
    sender_counts: list[int | None] = (
        [None] * settings.senders
        if settings.count is None
        else list(shares(settings.count, settings.senders))
    )

    def arrow(role: Role, i: int, count: int | None, duration: float | None) -> ArrowConfig:
        return ArrowConfig(
            role=role,
            index=i + 1,
            host=endpoint.host,
            port=endpoint.port + i if settings.peer_to_peer else endpoint.port,
            address=endpoint.address,
            listen=settings.peer_to_peer and role == "receiver",
            count=count,
            duration=duration,
            body_size=settings.body_size,
            credit=settings.credit,
            durable=settings.durable,
            presettled=settings.presettled,
            not_before_ns=start_ns,
            timeout=settings.timeout,
        )

    senders = [
        arrow("sender", i, sender_counts[i], settings.duration) for i in range(settings.senders)
    ]
    # A receiver never takes more than its own sender's share peer to peer, or the whole count.
    receiver_limits: list[int | None] = (
        sender_counts if settings.peer_to_peer else [settings.count] * settings.receivers
    )
    receivers = [arrow("receiver", i, receiver_limits[i], None) for i in range(settings.receivers)]
    return senders, receivers
