"""What clients' connections, sessions and links make the server hold, all together.

Each endpoint costs memory the memory budget does not count: proton's and the server's records
of a connection, a session and a link, and the ATTACH data (names, termini, filters,
properties) proton keeps of each link and the server echoes. One connection's share has caps
(``channel_max``, ``max_links_per_session``, ``max_attach_data_size``), but connections are
many, and N clients could make the server hold N times them.
This account caps the sum (``max_endpoints_size``, docs/bounds.md).

Two rules keep a few clients from locking the others out of it:

- everyone is refused only once the sum is at the limit;
- what a connection holds beyond its :data:`ALLOWANCE` (the connection, a session and a few
  dozen links with small termini, what a client publishing and consuming on a few queues
  holds) shares half of the limit with what every other connection holds beyond its own. A
  client attaching thousands of links, or links with megabytes of data, fills that half and is
  refused there, while clients within their allowance still open, begin and attach.

Plain integers in, plain integers out: the gateway keeps each connection's holding and asks.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024

# Fixed costs, measured as RSS per endpoint with thousands of each (docs/operations.md, "What
# one connection can make the server hold"): proton's transport, connection and buffers with
# the server's records for a connection; proton's session and the server's outbound session;
# proton's link and the server's link record, beside its ATTACH data, counted apart.
CONNECTION_COST: Final = 25 * KiB
SESSION_COST: Final = 4 * KiB
LINK_COST: Final = 2 * KiB
# What every connection may hold before it competes for the shared half: a connection, a
# session and some fifteen links with small termini.
ALLOWANCE: Final = 64 * KiB
# What connections hold beyond their allowance shares 1/EXCESS_SHARE of the limit.
EXCESS_SHARE: Final = 2


def _beyond(holding: int) -> int:
    return holding - ALLOWANCE if holding > ALLOWANCE else 0


class EndpointMemory:
    """The sum of what connections hold, and the part of it beyond their allowances."""

    __slots__ = ("beyond", "held", "limit", "peak")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the endpoints' limit must be positive, got {limit}")
        self.limit = limit
        self.held = 0
        self.beyond = 0
        # The most ``held`` has been: what tests hold against the limit.
        self.peak = 0

    def refusal(self, holding: int, size: int) -> str | None:
        """Why a connection holding ``holding`` bytes may not take ``size`` more; None if it
        may."""
        if self.held + size > self.limit:
            return (
                f"the server's connections, sessions and links hold {self.held} bytes of "
                f"the {self.limit} max_endpoints_size allows"
            )
        after = holding + size
        if after <= ALLOWANCE:
            return None
        shared = self.limit // EXCESS_SHARE
        if self.beyond + _beyond(after) - _beyond(holding) <= shared:
            return None
        return (
            f"this connection holds {holding} bytes of sessions and links, and what "
            f"connections hold beyond {ALLOWANCE} bytes each is at the {shared} bytes they "
            "share (half of max_endpoints_size)"
        )

    def change(self, holding: int, size: int) -> int:
        """Take ``size`` bytes (given back, if negative) for a connection holding ``holding``;
        return what it holds then."""
        after = holding + size
        self.held += size
        self.beyond += _beyond(after) - _beyond(holding)
        if self.held > self.peak:
            self.peak = self.held
        return after
