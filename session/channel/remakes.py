"""When the supervisor makes a channel again after a worker ended it for a protocol error
(docs/workers.md, "A broken peer ends the channel").

A worker that reads a broken frame closes the channel and tells the supervisor which one (the
other worker and the channel's serial number); the supervisor then makes the pair a fresh
socket pair the way it does for a restarted worker. A peer that keeps breaking the protocol
gets its next channel a pause later, doubled at each error in a row, so garbage costs one
channel per :data:`MAX_PAUSE` at most rather than a spin. Pure: the supervisor passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

# Seconds before the first remake of a channel, doubled at each protocol error in a row up to
# MAX_PAUSE: the same schedule as a worker that fails to start (gateway/supervisor.py), so a
# peer sending garbage is retried, not spun on.
FIRST_PAUSE: Final = 0.5
MAX_PAUSE: Final = 30.0

# Two workers' indexes, the smaller first.
Pair: TypeAlias = tuple[int, int]


def pair_of(one: int, other: int) -> Pair:
    """The pair of workers ``one`` and ``other``, whichever way round."""
    return (one, other) if one < other else (other, one)


@dataclass
class _Channel:
    """The current channel of a pair of workers."""

    serial: int
    # When it was made, and protocol errors of its pair in a row.
    made: float
    errors: int = 0
    # When it is to be made again, once a worker reported it broken.
    due: float | None = None


class Remakes:
    """The channels of every pair of workers: their serial numbers and the remakes due.

    One entry per pair that ever had a channel: at most ``N * (N - 1) / 2`` for N workers,
    whatever the workers report (docs/bounds.md).
    """

    def __init__(self) -> None:
        self._channels: dict[Pair, _Channel] = {}
        self._serial = 0

    def made(self, pair: Pair, now: float) -> int:
        """A new channel for ``pair`` (at a fork or a remake): its serial number. A remake that
        was due is done; the errors in a row are kept, so the next pause is longer."""
        self._serial += 1
        channel = self._channels.get(pair)
        if channel is None:
            self._channels[pair] = _Channel(self._serial, now)
        else:
            channel.serial, channel.made, channel.due = self._serial, now, None
        return self._serial

    def broken(self, pair: Pair, serial: int, now: float) -> float | None:
        """A worker of ``pair`` ended its channel ``serial`` for a protocol error: the pause
        before the new one, or None if nothing is to be done (a channel made since, or a
        remake already due: the other worker may report the same channel too).

        A channel that served for :data:`MAX_PAUSE` before it broke starts a new run: one bad
        frame a day is not punished as a flood is.
        """
        channel = self._channels.get(pair)
        if channel is None or channel.serial != serial or channel.due is not None:
            return None
        if now - channel.made >= MAX_PAUSE:
            channel.errors = 0
        channel.errors += 1
        pause: float = min(FIRST_PAUSE * 2.0 ** (channel.errors - 1), MAX_PAUSE)
        channel.due = now + pause
        return pause

    def due(self, now: float) -> list[Pair]:
        """The pairs whose channel is to be made again now."""
        return [
            pair
            for pair, channel in self._channels.items()
            if channel.due is not None and channel.due <= now
        ]

    def cancel(self, pair: Pair) -> None:
        """A worker of ``pair`` is not running: it gets fresh channels when it is forked again."""
        channel = self._channels.get(pair)
        if channel is not None:
            channel.due = None
