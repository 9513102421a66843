"""What a blocked owner gives back of another worker's parked publishes (gateway/peers.py's
``_give_back``): past its window, the publishes to queues nobody reads go back before those
to light queues, which it stores as soon as it is under its publishers' ceiling again. Worker
1 in a real reactor; the test writes worker 0's frames and reads its confirms."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.worker_one import Worker1, confirms, parked, publish_frame, weights_read, worker_one

from sluicegate.gateway.peers import GIVE_BACK_STEP
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.session.channel.codec import FrameReader
from sluicegate.session.channel.frames import Confirm, Settled
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp

# Worker 1's limit: a margin of 1 MiB, a holder's floor of 256 KiB, and a window of 256 KiB for
# worker 0's parked publishes (the letters' part, one peer).
LIMIT = 8 * 1024 * 1024
LARGE = amqp(Described(0x75, b"x" * 100_000))
PROBE = amqp(Described(0x77, "probe"))
HEAVY_PUBLISHER = 2
LIGHT_PUBLISHER = 4


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
        frames = [publish_frame(n, "heavy", [LARGE], HEAVY_PUBLISHER) for n in range(1, 5)]
        frames.append(publish_frame(5, "light", [PROBE], LIGHT_PUBLISHER))
        parked(worker, frames)
        reader = FrameReader(1 << 21)
        # At the ceiling nothing is stored, and the window keeps the light publish first.
        worker.peers.flush(budget)
        given_back = confirms(worker, reader, 2)
        assert given_back == {3: Settled.RELEASED, 4: Settled.RELEASED}
        # Under the ceiling again, still blocked: the light queue's publish is stored.
        budget.update(budget.limit + 1)
        worker.peers.flush(budget)
        assert confirms(worker, reader, 1) == {5: Settled.ACCEPTED}
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
        frames = [publish_frame(n, "heavy", [LARGE], 0, letters=True) for n in range(1, 4)]
        frames.append(publish_frame(4, "heavy", [LARGE], HEAVY_PUBLISHER))
        frames.append(publish_frame(5, "light", [PROBE, PROBE], LIGHT_PUBLISHER))
        parked(worker, frames)
        reader = FrameReader(1 << 21)
        worker.peers.flush(budget)
        assert confirms(worker, reader, 1) == {4: Settled.RELEASED}
        budget.update(budget.limit + 1)
        worker.peers.flush(budget)
        assert confirms(worker, reader, 2) == {5: Settled.ACCEPTED, 6: Settled.ACCEPTED}


def test_the_parked_are_walked_once_a_step_of_the_window_is_parked_anew_reading_each_queue_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adversary seed 65890: walked at every flush that parked anything, reading each parked
    publish's queue statistics, 4,800 small publishes parked took 5 ms a flush (15 ms with
    the statistics) and a stream of them held the reactor for the whole second. A walk now
    waits for a sixteenth of the window parked anew, and reads each queue's weight once."""
    budget = MemoryBudget(LIMIT)
    read = weights_read(monkeypatch)
    with worker_one(tmp_path, budget) as worker:
        _at_the_ceiling(worker, budget)
        window = budget.keep_for_letters(1)
        # Four publishes that leave 1,000 bytes of the window (each small enough for the socket
        # pair), then one of 2,000 bytes: past the window by less than a step.
        quarter = _payload((window - 1_000) // 4 - MESSAGE_OVERHEAD)
        parked(worker, [publish_frame(n, "heavy", [quarter], HEAVY_PUBLISHER) for n in range(1, 5)])
        reader = FrameReader(1 << 21)
        worker.peers.flush(budget)
        assert read == ["heavy"], "one read of the queue's weight for its four publishes"
        over = _payload(2_000 - MESSAGE_OVERHEAD)
        assert window // GIVE_BACK_STEP > 2_000
        parked(worker, [publish_frame(5, "heavy", [over], HEAVY_PUBLISHER)])
        worker.peers.flush(budget)
        assert not _any_confirm(worker, reader), "nothing given back yet"
        # A step more parked: the window is kept again, the newest past it given back.
        parked(worker, [publish_frame(6, "heavy", [LARGE], HEAVY_PUBLISHER)])
        worker.peers.flush(budget)
        assert confirms(worker, reader, 2) == {5: Settled.RELEASED, 6: Settled.RELEASED}


def _payload(size: int) -> bytes:
    """An encoded AMQP value section of exactly ``size`` bytes (a vbin32 past 255 bytes)."""
    encoded = amqp(Described(0x75, b"x" * (size - len(amqp(Described(0x75, b"x" * 256))) + 256)))
    assert len(encoded) == size
    return encoded


def _any_confirm(worker: Worker1, reader: FrameReader) -> bool:
    """Whether worker 1 sent worker 0 an outcome within a moment."""
    worker.zero.settimeout(0.2)
    try:
        while True:
            if any(isinstance(frame, Confirm) for frame in reader.feed(worker.zero.recv(1 << 16))):
                return True
    except TimeoutError:
        return False
