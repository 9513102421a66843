"""Issue 31: half-sent HTTP requests must not take the server's descriptors from AMQP clients.

Before: ~1,050 half-sent requests to the metrics endpoint each held a thread and a descriptor
for ever; at 1,024 descriptors the AMQP listener could accept no one and the CPU ran at 100 %.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from support.prober import Prober
from support.process import serving

# Half-sent requests, as in the report, split between the metrics endpoint and the API.
ATTACKERS: Final = 1100
DESCRIPTOR_LIMIT: Final = 1024
CAP: Final = 32
DEADLINE: Final = 2.0
# What the server may hold beyond its idle count while attacked: both listeners' caps, the
# prober's connection and a burst of sockets accepted and not yet closed.
DESCRIPTOR_MARGIN: Final = 2 * CAP + 64
# Worst round-trip of the AMQP prober while attacked (a loaded 2-core machine).
PROBE_BOUND: Final = 5.0
HALF_SENT: Final = b"GET /metrics HTTP/1.1\r\nHost: attacker\r\n"


@pytest.fixture
def enough_descriptors() -> Iterator[None]:
    """The attacker's sockets live in this process: raise its soft limit for the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = ATTACKERS + 512
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed} needed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _descriptors(pid: int) -> int:
    return len(os.listdir(Path(f"/proc/{pid}/fd")))


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed (or reset) this socket; never waits."""
    sock.setblocking(False)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("enough_descriptors")
def test_half_sent_http_requests_leave_amqp_clients_served() -> None:
    """1,100 half-sent requests to the metrics endpoint and the API, at a descriptor limit of
    1,024: the server's descriptors stay within the HTTP caps, an AMQP prober connects and is
    served throughout, every half-sent socket is closed within the request deadline, and then
    a scrape and an API request are answered."""
    metrics, api = _free_port(), _free_port()
    env = {
        **os.environ,
        "SLUICEGATE_HTTP_MAX_CONNECTIONS": str(CAP),
        "SLUICEGATE_HTTP_REQUEST_TIMEOUT": str(DEADLINE),
    }
    options = ("--metrics-listen", f"127.0.0.1:{metrics}", "--http-api-listen", f"127.0.0.1:{api}")
    with serving(*options, env=env, descriptors=DESCRIPTOR_LIMIT) as (process, port):
        idle = _descriptors(process.pid)
        attackers: list[socket.socket] = []
        most = 0
        try:
            with Prober(f"amqp://127.0.0.1:{port}") as prober:
                start = time.monotonic()
                for index in range(ATTACKERS):
                    sock = socket.socket()
                    sock.settimeout(5)
                    try:
                        sock.connect(("127.0.0.1", metrics if index % 2 else api))
                        sock.sendall(HALF_SENT)
                    except OSError:
                        pass  # refused or reset at once: the cap at work
                    attackers.append(sock)
                    if index % 50 == 0:
                        most = max(most, _descriptors(process.pid))
                sent = time.monotonic() - start
                prober.wait_rounds(3, timeout=60)
                most = max(most, _descriptors(process.pid))
            # Within the deadline (and a margin for a loaded machine) after the last was sent,
            # the server has closed every one of them.
            deadline = time.monotonic() + DEADLINE + 5
            open_ = list(attackers)
            while open_ and time.monotonic() < deadline:
                open_ = [sock for sock in open_ if not _closed_by_server(sock)]
                time.sleep(0.2)
        finally:
            for sock in attackers:
                sock.close()
        seen = prober.seen
        assert seen.failures == []
        assert seen.worst < PROBE_BOUND, seen.rounds
        assert most <= idle + DESCRIPTOR_MARGIN, (idle, most)
        assert open_ == [], f"{len(open_)} half-sent sockets still open {sent:.1f} s in"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=30) as reply:
            assert b"sluicegate_connections" in reply.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{api}/api/overview", timeout=30) as reply:
            assert reply.status == 200
