"""Dead letters sent to another worker's queues stay within the channel's window until the
owner confirms them (issue 31, docs/workers.md): a letter has no publisher whose credit waits
for its confirm, so the window is what bounds what the owner may have to park."""

from __future__ import annotations

import pytest

from sluicegate.queues.message import Message
from sluicegate.session.channel.frames import Confirm, Publish, Settled
from sluicegate.session.channel.remote import Remote, RemoteQueue, WorkerDown

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
