"""A free TCP port on loopback, for a listener a test starts and must know beforehand."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nobody listens on now (another process may take it before the test does)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
