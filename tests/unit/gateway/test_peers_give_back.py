"""What a blocked owner gives back of another worker's parked publishes (gateway/peers.py's
``_give_back``): past its window, the publishes to queues nobody reads go back before those
to light queues, which it stores as soon as it is under its publishers' ceiling again. Worker
1 in a real reactor; the test writes worker 0's frames and reads its confirms."""

from __future__ import annotations

import time
from pathlib import Path

from support.worker_one import WITHIN, Worker1, worker_one

from sluicegate.queues.message import Message
from sluicegate.session.channel.codec import FrameReader, encode
from sluicegate.session.channel.frames import Confirm, Publish, Settled, Stamp
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp
from sluicegate.wire.sections import DEFAULT_HEADER

# Worker 1's limit: a margin of 1 MiB, a holder's floor of 256 KiB, and a window of 256 KiB for
# worker 0's parked publishes (the letters' part, one peer).
LIMIT = 8 * 1024 * 1024
LARGE = amqp(Described(0x75, b"x" * 100_000))
PROBE = amqp(Described(0x77, "probe"))
HEAVY_PUBLISHER = 2
LIGHT_PUBLISHER = 4


def _publish(
    publish: int, queue: str, payloads: list[bytes], publisher: int, letters: bool = False
) -> bytes:
    """Worker 0's run of ``payloads`` to ``queue``, published on its link ``publisher`` (0:
    dead letters)."""
    stamps: list[Stamp] = [(None, DEFAULT_HEADER, 0)] * len(payloads)
    frame = Publish(publish, "/", queue, "", queue, payloads, stamps, letters, publisher)
    return b"".join(encode(frame))


def _parked(worker: Worker1, frames: list[bytes]) -> None:
    """Worker 0's runs sent, and parked by worker 1, one at a time: the socket pair holds
    less than them all."""
    worker.container.timeout = 0.1  # a turn with nothing to read ends
    for count, frame in enumerate(frames, 1):
        worker.send(frame)
        deadline = time.monotonic() + WITHIN
        while len(worker.peers._parked) < count:
            assert time.monotonic() < deadline
            worker.container.process()


def _at_the_ceiling(worker: Worker1, budget: MemoryBudget) -> None:
    """A queue nobody reads past a holder's floor, an empty one, and the budget at its
    publishers' ceiling: nothing is stored."""
    registry = worker.registry
    heavy = registry.declare_queue("heavy")
    registry.declare_queue("light")
    for _ in range(3):
        heavy.enqueue(Message(LARGE))
    budget.keep_for_letters(1)
    budget.update(budget.ceiling)
    assert budget.blocked
    assert budget.publishers_full(budget.used)


def _confirms(worker: Worker1, reader: FrameReader, wanted: int) -> dict[int, Settled]:
    """The outcomes worker 1 sent worker 0, by publish id, once ``wanted`` are in."""
    outcomes: dict[int, Settled] = {}
    worker.zero.settimeout(WITHIN)
    while len(outcomes) < wanted:
        for frame in reader.feed(worker.zero.recv(1 << 16)):
            if isinstance(frame, Confirm):
                for publish in range(frame.first, frame.last + 1):
                    outcomes[publish] = frame.outcome
    return outcomes


def test_past_the_window_publishes_to_queues_nobody_reads_go_back_before_a_light_ones(
    tmp_path: Path,
) -> None:
    """Adversary seed 65832: a moment at the owner's ceiling (a fan-out's copies to another
    worker, counted whole until confirmed) parked the prober's publish behind 1 MB of a
    fan-out's copies to queues nobody read, and the window walk gave back the newest, the
    prober's. Now the light queue's publish keeps its place in the window, and is stored once
    the owner is under its ceiling."""
    budget = MemoryBudget(LIMIT)
    with worker_one(tmp_path, budget) as worker:
        _at_the_ceiling(worker, budget)
        frames = [_publish(n, "heavy", [LARGE], HEAVY_PUBLISHER) for n in range(1, 5)]
        frames.append(_publish(5, "light", [PROBE], LIGHT_PUBLISHER))
        _parked(worker, frames)
        reader = FrameReader(1 << 21)
        # At the ceiling nothing is stored, and the window keeps the light publish first.
        worker.peers.flush(budget)
        given_back = _confirms(worker, reader, 2)
        assert given_back == {3: Settled.RELEASED, 4: Settled.RELEASED}
        # Under the ceiling again, still blocked: the light queue's publish is stored.
        budget.update(budget.limit + 1)
        worker.peers.flush(budget)
        assert _confirms(worker, reader, 1) == {5: Settled.ACCEPTED}
        assert worker.registry.queue("light").statistics().ready == 1


def test_a_light_queues_publish_keeps_its_place_behind_letters_filling_the_window(
    tmp_path: Path,
) -> None:
    """Adversary seed 65842: worker 0's letters parked on worker 1 filled the window, and
    every publish past them went back, the prober's too. Publishes to light queues have a
    window of their own; the others get what the letters leave."""
    budget = MemoryBudget(LIMIT)
    with worker_one(tmp_path, budget) as worker:
        _at_the_ceiling(worker, budget)
        frames = [_publish(n, "heavy", [LARGE], 0, letters=True) for n in range(1, 4)]
        frames.append(_publish(4, "heavy", [LARGE], HEAVY_PUBLISHER))
        frames.append(_publish(5, "light", [PROBE, PROBE], LIGHT_PUBLISHER))
        _parked(worker, frames)
        reader = FrameReader(1 << 21)
        worker.peers.flush(budget)
        assert _confirms(worker, reader, 1) == {4: Settled.RELEASED}
        budget.update(budget.limit + 1)
        worker.peers.flush(budget)
        assert _confirms(worker, reader, 2) == {5: Settled.ACCEPTED, 6: Settled.ACCEPTED}
