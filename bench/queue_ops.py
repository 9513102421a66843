"""Pure classic-queue operations per second: ``python -m bench.queue_ops``. No server.

One cycle is what a message costs the queue between its publisher and its consumer's accept:
a new :class:`~queues.message.Message` enqueued, acquired by a consumer's credit request, and
archived by its settlement. Cycles run in batches (the session asks a queue for credit in
batches, up to 256), behind 1, 10 or 1,000,000 messages already queued, and once more with
10 % of the deliveries released (each goes back to its original position and is delivered
again, then accepted). The target is ≥ 300,000 cycles per second, flat from 10 to 1,000,000
queued. Figures are printed as one Markdown table, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Final

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome

CONSUMER: Final = "consumer"
# A 100-byte message, quiver's default and the size of docs/benchmarks.md's runs.
PAYLOAD: Final = bytes(100)
DEPTHS: Final = (1, 10, 1_000_000)


def run(depth: int, cycles: int, batch: int, release_every: int) -> float:
    """Cycles per second behind ``depth`` queued messages; every ``release_every``-th delivery
    is released once (0: none)."""
    queue = ClassicQueue("bench")
    queue.attach(CONSUMER, ack_required=True)
    for _ in range(depth):
        queue.enqueue(Message(PAYLOAD))
    delivery_count = 0
    archived = 0
    released_seqs: set[int] = set()
    started = time.perf_counter()
    while archived < cycles:
        for _ in range(batch):
            queue.enqueue(Message(PAYLOAD))
        delivered, reply = queue.credit(CONSUMER, delivery_count, batch, False)
        delivery_count = reply.delivery_count
        seqs = [message.seq for message in delivered]
        if release_every:
            # Release each message at most once, or a released one could bounce forever.
            release = [s for s in seqs[::release_every] if s not in released_seqs]
            released_seqs.update(release)
            accept = [s for s in seqs if s not in release]
            queue.settle(CONSUMER, release, Outcome.RELEASED, False)
        else:
            accept = seqs
        queue.settle(CONSUMER, accept, Outcome.ACCEPTED, False)
        archived += len(accept)
    elapsed = time.perf_counter() - started
    stats = queue.statistics()
    # Every message enqueued during the run is accounted for: archived or still queued.
    assert stats.acknowledged + stats.ready + stats.unacked == stats.published
    return archived / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    """Run every depth with and without releases and print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.queue_ops", description=__doc__)
    parser.add_argument("--cycles", type=int, default=300_000, help="cycles per run")
    parser.add_argument("--batch", type=int, default=100, help="credit batch per request")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median shown)")
    args = parser.parse_args(argv)
    print(f"| queued | releases | cycles/s (median of {args.repeat}, batch {args.batch}) |")
    print("|---:|---:|---:|")
    for release_every, label in ((0, "0 %"), (10, "10 %")):
        for depth in DEPTHS:
            rates = [run(depth, args.cycles, args.batch, release_every) for _ in range(args.repeat)]
            print(f"| {depth:,} | {label} | {statistics.median(rates):,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
