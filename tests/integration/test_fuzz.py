"""Hostile byte streams over real sockets: the server never fails and other clients carry on
(issue 10 §7).

Hypothesis builds each connection's input from valid frames (BEGIN, ATTACH, FLOW, TRANSFER,
DISPOSITION, DETACH, END, CLOSE with fields drawn from small ranges, so they collide: reused
handles, unknown channels, transfers without credit), random bytes, truncated frames and
frames with one byte changed, optionally after a SASL exchange and OPEN or in place of them.
After each example a long-lived canary connection must still answer, and at the end no
"internal error" was logged, every fuzzed connection is gone and messages still flow.

``FUZZ_EXAMPLES`` raises the number of examples for a longer local run (CI: the default).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from integration.conftest import RunningServer, start_server
from proton import Message, symbol, ubyte, uint, ushort
from support.clients import consume, publish
from support.frames import (
    AMQP_HEADER,
    FRAME_HEADER,
    SASL_FRAME,
    SASL_HEADER,
    described,
    encode_frame,
)
from support.polling import wait_until
from support.raw_client import RawClient

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
# How long to read the server's answer to one example; what arrives later is not needed.
READ_SECONDS = 0.3

_small = st.integers(min_value=0, max_value=3)
_window = st.sampled_from([0, 1, 2, 100, 2**31 - 1, 2**32 - 1])
_address = st.sampled_from(["/queues/fuzz", "fuzz", "/queues/", "/exchanges/x", "", "a/b/c"])


@st.composite
def _performative(draw: st.DrawFn) -> bytes:
    channel = draw(_small)
    kind = draw(
        st.sampled_from(
            ["begin", "attach", "flow", "transfer", "disposition", "detach", "end", "close"]
        )
    )
    if kind == "begin":
        body = described(
            "begin",
            remote_channel=draw(st.none() | _small.map(ushort)),
            next_outgoing_id=uint(draw(_window)),
            incoming_window=uint(draw(_window)),
            outgoing_window=uint(draw(_window)),
        )
    elif kind == "attach":
        role = draw(st.booleans())
        address = draw(_address)
        body = described(
            "attach",
            name=draw(st.sampled_from(["a", "b", ""])),
            handle=uint(draw(_small)),
            role=role,
            snd_settle_mode=ubyte(draw(st.integers(0, 3))),
            source=described("source", address=address, dynamic=draw(st.booleans()) or None),
            target=described("target", address=address),
            initial_delivery_count=None if role else uint(draw(_window)),
        )
    elif kind == "flow":
        body = described(
            "flow",
            next_incoming_id=draw(st.none() | _window.map(uint)),
            incoming_window=uint(draw(_window)),
            next_outgoing_id=uint(draw(_window)),
            outgoing_window=uint(draw(_window)),
            handle=draw(st.none() | _small.map(uint)),
            delivery_count=draw(st.none() | _window.map(uint)),
            link_credit=draw(st.none() | _window.map(uint)),
            drain=draw(st.booleans()),
            echo=draw(st.booleans()),
        )
    elif kind == "transfer":
        message = Message(body=draw(st.binary(max_size=40))).encode()
        payload = draw(st.sampled_from([message, message[:3], b"", b"\x00\x53"]))
        body = described(
            "transfer",
            handle=uint(draw(_small)),
            delivery_id=draw(st.none() | _window.map(uint)),
            delivery_tag=draw(st.binary(max_size=4)),
            message_format=uint(0),
            settled=draw(st.booleans()),
            more=draw(st.booleans()),
            aborted=draw(st.booleans()) or None,
        )
        return encode_frame(channel, body, payload)
    elif kind == "disposition":
        first = draw(_window)
        body = described(
            "disposition",
            role=draw(st.booleans()),
            first=uint(first),
            last=draw(st.none() | st.just(uint(first)) | _window.map(uint)),
            settled=draw(st.booleans()),
            state=draw(st.sampled_from([None, described("accepted"), described("released")])),
        )
    elif kind == "detach":
        body = described("detach", handle=uint(draw(_small)), closed=draw(st.booleans()))
    elif kind == "end":
        body = described("end")
    else:
        body = described("close")
    return encode_frame(channel, body)


@st.composite
def _damaged(draw: st.DrawFn) -> bytes:
    frame = draw(_performative())
    how = draw(st.sampled_from(["truncate", "flip", "random"]))
    if how == "random":
        return draw(st.binary(min_size=1, max_size=64))
    position = draw(st.integers(min_value=0, max_value=len(frame) - 1))
    if how == "truncate":
        return frame[:position]
    flipped = frame[position] ^ draw(st.integers(min_value=1, max_value=255))
    return frame[:position] + bytes([flipped]) + frame[position + 1 :]


def _opening(sasl: bool) -> bytes:
    sasl_part = b""
    if sasl:
        init = described("sasl_init", mechanism=symbol("ANONYMOUS"), initial_response=b"")
        sasl_part = SASL_HEADER + encode_frame(0, init, frame_type=SASL_FRAME)
    open_frame = encode_frame(0, described("open", container_id="fuzz", max_frame_size=uint(4096)))
    return sasl_part + AMQP_HEADER + open_frame


_stream = st.tuples(
    st.sampled_from(["sasl+open", "open", "none"]),
    st.lists(_performative() | _damaged(), min_size=1, max_size=12),
)


class _InternalErrors(logging.Handler):
    """Counts the server's reports of a failure it contained (gateway/server.py)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("sluicegate"):
            self.records.append(record.getMessage())


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[RunningServer]:
    running = start_server(max_frame_size=4096, metrics_listen="off")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def internal_errors() -> Iterator[_InternalErrors]:
    handler = _InternalErrors()
    logger = logging.getLogger("sluicegate")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def canary(fuzzed: RunningServer) -> Iterator[RawClient]:
    with RawClient.connect(fuzzed.host, fuzzed.port) as client:
        yield client


def _send_and_listen(running: RunningServer, data: bytes) -> None:
    with socket.create_connection((running.host, running.port), timeout=READ_SECONDS) as sock:
        try:
            sock.sendall(data)
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stream=_stream)
@pytest.mark.slow
def test_hostile_streams_never_break_the_server(
    fuzzed: RunningServer,
    canary: RawClient,
    internal_errors: _InternalErrors,
    stream: tuple[str, list[bytes]],
) -> None:
    opening, frames = stream
    prefix = b"" if opening == "none" else _opening(opening == "sasl+open")
    _send_and_listen(fuzzed, prefix + b"".join(frames))
    # The canary's connection still answers: a session opens and ends.
    canary.begin()
    canary.end()
    canary.wait_for("end")
    assert internal_errors.records == []


def test_after_the_fuzzing_everything_is_clean(
    fuzzed: RunningServer, canary: RawClient, internal_errors: _InternalErrors
) -> None:
    # Runs after the fuzz test in this module (pytest keeps definition order).
    canary.begin()
    wait_until(lambda: fuzzed.call(lambda: len(fuzzed.server.broker.connections)) == 1, timeout=60)
    assert publish(fuzzed.url, "/queues/after-fuzz", ["ok"]).outcomes == ["accepted"]
    assert consume(fuzzed.url, "/queues/after-fuzz", 1).bodies == ["ok"]
    assert internal_errors.records == []


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(FRAME_HEADER.pack(16, 2, 0, 0) + b"\xff" * 8, id="garbage-body"),
        pytest.param(FRAME_HEADER.pack(11, 2, 0, 0) + b"\x00\x53\x10", id="truncated-open"),
        pytest.param(FRAME_HEADER.pack(14, 2, 0, 0) + b"\x00\x53\x77\x45\x00\x00", id="unknown"),
        pytest.param(FRAME_HEADER.pack(12, 2, 1, 0) + b"\x00" * 4, id="sasl-type-after-open"),
        pytest.param(FRAME_HEADER.pack(16, 2, 0, 0) + b"\x00\x53\x11\xa1\x03abc", id="not-a-list"),
    ],
)
def test_an_undecodable_frame_after_open_is_answered_with_decode_error(
    fuzzed: RunningServer, frame: bytes
) -> None:
    """Proton stops reading such a frame silently; the server closes with amqp:decode-error."""
    with RawClient.connect(fuzzed.host, fuzzed.port) as client:
        client.send_raw(frame)
        close = client.wait_for("close")
    assert close["error"]["condition"] == "amqp:decode-error"


@pytest.mark.slow
def test_an_undecodable_frame_instead_of_open_drops_the_connection(fuzzed: RunningServer) -> None:
    """Proton sends no CLOSE before the client's OPEN, so the server closes the socket."""
    with socket.create_connection((fuzzed.host, fuzzed.port), timeout=30) as sock:
        sock.sendall(AMQP_HEADER + FRAME_HEADER.pack(16, 2, 0, 0) + b"\xff" * 8)
        while sock.recv(65536):
            pass  # EOF ends the loop; a timeout would fail the test
    wait_until(lambda: fuzzed.call(lambda: len(fuzzed.server.broker.connections)) <= 1)
