"""``python -m bench.channel_cost``: what crossing from one worker to another costs a message.

Issue 35 asks for the cost of the crossing in µs per message. This measures the channel alone,
both ends in one process over a real socket pair: the owner's side counts the batch against the
consumer's credit (``QueueEnd``), encodes it and writes it with one ``sendmsg``; the session's
side reads it into its buffer, decodes it (one copy of each payload) and checks it against the
credit (``SessionEnd``). CPU time is the process's, so the figure is both ends' work together;
it is what a cross-worker delivery adds to a local one, before the session and the writer,
which a local delivery pays too. Prints a Markdown table. ``--pinned`` measures whole servers
instead, a publisher and a consumer pinned to one worker and the queue on the other
(bench/pinned_cost.py).
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Sequence
from typing import Final

from bench import pinned_cost
from sluicegate.session.channel.codec import FRAME_OVERHEAD, FrameReader, encode
from sluicegate.session.channel.ends import QueueEnd, SessionEnd
from sluicegate.session.channel.frames import Credit, CreditReply, Deliveries

# One message at a time, a small batch, and a queue's largest batch (max_queue_credit).
BATCHES: Final = (1, 16, 256)
# quiver's 100-byte bodies, and a page.
SIZES: Final = (100, 4096)
# Socket buffers that hold the largest batch measured, so one sendmsg never blocks.
_BUFFER: Final = 4 * 1024 * 1024


def crossing_cpu(batch: int, size: int, messages: int) -> float:
    """CPU µs per message to send ``messages`` of ``size`` bytes across in batches of ``batch``."""
    owner, session = socket.socketpair()
    for sock in (owner, session):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
    payloads = tuple(bytes(size) for _ in range(batch))
    reader = FrameReader(batch * size + FRAME_OVERHEAD + 16 * batch)
    buffer = bytearray(_BUFFER)
    view = memoryview(buffer)
    queue_end, session_end = QueueEnd(1, ack_required=True), SessionEnd(1)
    rounds = max(1, messages // batch)
    started = time.process_time()
    for number in range(rounds):
        request = session_end.request(batch, False, False)
        assert request is not None
        queue_end.granted(request)
        queue_end.sending(batch)
        first = number * batch
        owner.sendmsg(encode(Deliveries(1, tuple(range(first, first + batch)), payloads)))
        reply = queue_end.reply(request, queue_end.delivery_count, 0, 0)
        owner.sendmsg(encode(reply))
        frames: list[Deliveries | CreditReply | Credit] = []
        while len(frames) < 2:
            received = session.recv_into(buffer)
            for frame in reader.feed(view[:received]):
                assert isinstance(frame, Deliveries | CreditReply)
                frames.append(frame)
        deliveries, answer = frames
        assert isinstance(deliveries, Deliveries)
        assert isinstance(answer, CreditReply)
        session_end.delivered(len(deliveries.payloads))
        session_end.replied(answer)
    elapsed = time.process_time() - started
    owner.close()
    session.close()
    return elapsed / (rounds * batch) * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.channel_cost", description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per row")
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="instead: whole servers' CPU per message, local and across workers "
        "(bench/pinned_cost.py)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="--pinned: runs per case")
    args = parser.parse_args(argv)
    if args.pinned:
        print("\n".join(pinned_cost.report(args.messages, args.rounds)))
        return 0
    print("| batch | body bytes | CPU µs per message, both ends |")
    print("|---:|---:|---:|")
    for batch in BATCHES:
        for size in SIZES:
            cost = crossing_cpu(batch, size, args.messages)
            print(f"| {batch} | {size} | {cost:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
