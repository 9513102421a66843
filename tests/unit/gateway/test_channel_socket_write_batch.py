"""A channel's flush writes at most a batch however fast the other worker reads
(gateway/proton/channel_socket.py, docs/bounds.md): a fan-out's copies share one payload in
memory but cross the channel once per queue, and a flush that wrote for as long as the socket
took more held every client of its worker meanwhile (seed 66073, docs/adversary.md). The rest
waits for writability, and every byte still arrives, in order."""

from __future__ import annotations

import hashlib
import socket
import threading

from proton.reactor import Container

from sluicegate.gateway.proton.channel_socket import WRITE_BATCH, ChannelSocket
from sluicegate.session.channel.codec import FrameReader

# A fan-out's copies as they wait: 4,096 pieces of 4 KiB, 16 MiB, sixteen batches.
PIECE: int = 4096
PIECES: int = 4096
WITHIN: float = 30.0


def _drain(sock: socket.socket, total: int, seen: list[bytes]) -> None:
    digest = hashlib.sha256()
    got = 0
    while got < total:
        data = sock.recv(1 << 20)
        if not data:
            break
        got += len(data)
        digest.update(data)
    seen.append(digest.digest())


def test_a_flush_writes_at_most_a_batch_while_the_other_worker_reads_on() -> None:
    ours, theirs = socket.socketpair()
    theirs.settimeout(WITHIN)
    ended: list[str] = []
    channel = ChannelSocket(
        Container(), ours, FrameReader(1 << 20), lambda frames: None, ended.append
    )
    pieces = [i.to_bytes(4, "big") * (PIECE // 4) for i in range(PIECES)]
    total = PIECE * PIECES
    seen: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(theirs, total, seen))
    reader.start()
    try:
        channel.send(pieces)
        # At most one sendmsg past the batch, and a sendmsg takes at most the socket's buffer.
        past = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        flushes = 0
        while channel.output:
            before = sum(map(len, channel.output))
            channel.flush()
            written = before - sum(map(len, channel.output))
            assert written <= WRITE_BATCH + past
            assert channel.selectable.writing == bool(channel.output)
            flushes += 1
        assert flushes >= total // (WRITE_BATCH + past)
    finally:
        reader.join(WITHIN)
        ours.close()
        theirs.close()
    assert not ended
    assert seen == [hashlib.sha256(b"".join(pieces)).digest()]
