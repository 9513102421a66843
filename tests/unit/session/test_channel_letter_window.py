"""Dead letters sent to another worker's queues stay within the channel's window until the
owner confirms them (issue 31, docs/workers.md): a letter has no publisher whose credit waits
for its confirm, so the window is what bounds what the owner may have to park."""

from __future__ import annotations

import pytest
from support.placement import AllHere

from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Outcome, QueueType
from sluicegate.queues.quorum import DEAD_LETTER_RETRY_MS
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.frames import Confirm, Publish, Settled
from sluicegate.session.channel.remote import Remote, RemoteQueue, WorkerDown, letters_fitting
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

WINDOW = 1000


def _remote() -> Remote:
    remote = Remote(1)
    remote.opened()
    remote.letter_window = WINDOW
    return remote


def test_letters_fill_the_window_and_confirms_empty_it() -> None:
    remote = _remote()
    queue = RemoteQueue("sink", "/", remote)
    assert remote.letter_fits(WINDOW * 5)  # alone in it, however large
    queue.enqueue(Message(b"x" * 600))
    assert remote.letters_in_flight == 600
    assert remote.letter_fits(400)
    assert not remote.letter_fits(401)
    queue.enqueue(Message(b"y" * 400))
    # A publisher's publish in between is not a letter: its credit bounds it.
    token = object()
    assert queue.publish(token, Message(b"z" * 5000))
    assert remote.letters_in_flight == WINDOW
    assert remote.confirmed(Confirm(1, 2, Settled.ACCEPTED)) == [None, None]
    assert remote.letters_in_flight == 0
    assert remote.confirmed(Confirm(3, 3, Settled.ACCEPTED)) == [token]
    assert remote.letter_sizes == {}


def test_letters_cross_in_runs_of_their_own_which_the_owner_tells_apart() -> None:
    """The owner parks letters while its budget is blocked whatever their queue weighs
    (gateway/peers.py), so a run never mixes them with a publisher's messages."""
    remote = _remote()
    queue = RemoteQueue("sink", "/", remote)
    queue.enqueue(Message(b"x" * 100))
    queue.enqueue(Message(b"y" * 100))
    assert queue.publish(object(), Message(b"z" * 100))
    queue.enqueue(Message(b"w" * 100))
    runs = [(f.letters, len(f.payloads)) for f in remote.outgoing if isinstance(f, Publish)]
    assert runs == [(True, 2), (False, 1), (True, 1)]


def test_a_channel_that_ends_forgets_its_letters_and_refuses_new_ones() -> None:
    remote = _remote()
    queue = RemoteQueue("sink", "/", remote)
    queue.enqueue(Message(b"x" * 600))
    remote.lost()
    assert remote.letters_in_flight == 0
    assert remote.letter_sizes == {}
    # Refused, so that the letter is dropped or sent again at least once, never lost unseen.
    with pytest.raises(WorkerDown):
        queue.enqueue(Message(b"x"))


class _Far(AllHere):
    """A placement that puts the queues named ``far-...`` on worker 1, behind ``channel``."""

    def __init__(self, channel: Remote) -> None:
        self.channel = channel

    def remote(self, name: str) -> QueueType | None:
        return RemoteQueue(name, "/", self.channel) if name.startswith("far-") else None


# A fanout's queues on the other worker, and the letters each gets: each copy a third of the
# window, so that a letter's ten copies, 3.3 windows, went at once before.
FAR = 10
LETTERS = 3
BODY = 300


def _fanned(
    source_arguments: dict[str, object], near_arguments: dict[str, object] | None = None
) -> tuple[QueueRegistry, Remote, QueueType]:
    """A registry whose queue ``source`` dead-letters into a fanout of :data:`FAR` queues of
    another worker and one queue here, ``near``, bound between them."""
    remote = _remote()
    registry = QueueRegistry(Clock(1_000))
    registry.placement = _Far(remote)
    registry.dead_letter_router.fits = letters_fitting
    registry.declare_exchange("fx", "fanout")
    for index in range(FAR):
        registry.declare_queue(f"far-{index}")
        registry.bind("fx", f"far-{index}")
        if index == FAR // 2:
            registry.declare_queue("near", near_arguments)
            registry.bind("fx", "near")
    source = registry.declare_queue("source", {"x-dead-letter-exchange": "fx", **source_arguments})
    return registry, remote, source


def _letters_sent(remote: Remote) -> dict[str, list[bytes]]:
    """The letters' payloads each queue of the other worker was sent, in order."""
    sent: dict[str, list[bytes]] = {}
    for frame in remote.outgoing:
        if isinstance(frame, Publish) and frame.letters:
            sent.setdefault(frame.queue, []).extend(frame.payloads)
    return sent


def _confirm_all(remote: Remote) -> None:
    """The owner stored every letter sent so far."""
    if remote.letter_sizes:
        remote.confirmed(
            Confirm(min(remote.letter_sizes), max(remote.letter_sizes), Settled.ACCEPTED)
        )


def _reject_all(source: QueueType, count: int) -> None:
    source.attach("c", ack_required=True)
    messages, _ = source.credit("c", 0, count, False)
    source.settle("c", [m.seq for m in messages], Outcome.REJECTED, False)


def test_a_letters_copies_to_another_worker_go_in_groups_that_fit_the_window() -> None:
    """Adversary seed 69004: a letter weighed with all its copies still went whole once the
    window was empty, so a letter of 70 KB to 50 queues of another worker took its sender
    3.5 MB past a 1 MiB window. Its copies now go in groups within the window, the rest
    waiting for the owner's confirms, and every queue gets every letter once, in order; the
    rejected message leaves its queue only once its last copy went."""
    registry, remote, source = _fanned({})
    for index in range(LETTERS):
        source.enqueue(Message(encode(Described(0x77, f"{index}" * BODY))))
    _reject_all(source, LETTERS)
    router = registry.dead_letter_router
    waiting = source.statistics().dead_lettering_bytes
    passes = 0
    while registry.dead_letters:
        registry.route_dead_letters()
        assert remote.letters_in_flight <= WINDOW
        # Nothing left the source before the last group of its first letter went.
        if passes == 0:
            assert router.waiting
            assert source.statistics().dead_lettering_bytes == waiting
        _confirm_all(remote)
        passes += 1
        assert passes <= LETTERS * FAR
    assert remote.letters_peak <= WINDOW
    assert passes >= LETTERS * FAR * BODY // WINDOW
    sent = _letters_sent(remote)
    assert sorted(sent) == sorted(f"far-{index}" for index in range(FAR))
    for payloads in sent.values():
        assert len(payloads) == LETTERS
        assert all(str(index).encode() * BODY in payloads[index] for index in range(LETTERS))
    assert registry.queue("near").statistics().ready == LETTERS
    assert source.statistics().dead_lettering_bytes == 0
    assert router.dropped == 0


def test_the_window_takes_each_copy_with_those_before_it_and_one_larger_copy_alone() -> None:
    remote = _remote()
    here = QueueRegistry().declare_queue("here")
    far = [RemoteQueue(f"far-{n}", "/", remote) for n in range(4)]
    assert letters_fitting([far[0], here, far[1], far[2]], 400) == 3
    assert letters_fitting([here, *far], 600) == 2
    assert letters_fitting(far, WINDOW * 3) == 1  # alone, however large
    queue = far[0]
    queue.enqueue(Message(b"x" * 900))
    assert letters_fitting([here, *far], 100) == 2
    assert letters_fitting([*far, here], 101) == 0


def test_at_least_once_a_letter_in_groups_is_sent_again_only_where_it_was_refused() -> None:
    """A refusal in an early group is remembered until the last group went: the letter is
    then kept and sent again to the refusing queue only, never to the queues that took it,
    and its message stays in its quorum queue until then."""
    registry, remote, source = _fanned(
        {
            "x-queue-type": "quorum",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
        {"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    source.enqueue(Message(encode(Described(0x77, "0" * BODY))))
    _reject_all(source, 1)
    waiting = source.statistics().dead_lettering_bytes
    while registry.dead_letters:
        registry.route_dead_letters()
        _confirm_all(remote)
    assert remote.letters_peak <= WINDOW
    assert sorted(len(p) for p in _letters_sent(remote).values()) == [1] * FAR
    # Refused here: kept, still in its queue, and sent again to ``near`` alone.
    assert source.statistics().dead_lettering_bytes == waiting
    registry.queue("near").purge()
    registry.delete_queue("near")
    registry.declare_queue("near")
    registry.bind("fx", "near")
    registry.clock.now += DEAD_LETTER_RETRY_MS
    registry.expire()
    while registry.dead_letters:
        registry.route_dead_letters()
    assert registry.queue("near").statistics().ready == 1
    assert sorted(len(p) for p in _letters_sent(remote).values()) == [1] * FAR
    assert source.statistics().dead_lettering_bytes == 0
