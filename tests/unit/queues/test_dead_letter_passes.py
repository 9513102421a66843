"""Work a client can make dead-lettering and exchange deletion do is bounded per call.

Pure registries: RabbitMQ 4's cycle rule (a loop is broken unless a rejection lies inside it),
a pass that routes a bounded batch and waits for the memory budget's room, and an auto-delete
cascade of any length deleted without recursion.
"""

from __future__ import annotations

import sys

import pytest
from support.deaths import deaths_of

from sluicegate.queues import dead_lettering
from sluicegate.queues.dead_lettering import (
    COPIES_PER_PASS,
    HEAD_BYTES_PER_PASS,
    LETTERS_PER_PASS,
    WAITING_PASSES,
)
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Outcome, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.account import Account
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.deaths import Death, Recorded, record_death
from sluicegate.wire.encoding import encode
from sluicegate.wire.errors import AmqpError

_BODY = encode(Described(0x77, "m"))


def _died(payload: bytes, *deaths: tuple[str, str]) -> Recorded:
    """``payload`` with ``deaths`` recorded, oldest first: the last one recorded."""
    recorded = Recorded(payload, frozenset())
    for queue, reason in deaths:
        recorded = record_death(recorded.payload, Death(queue, reason, "", ("k",), 0))
    return recorded


@pytest.mark.parametrize(
    ("deaths", "target", "cycle"),
    [
        # Back to a queue it expired in, with nothing but automatic deaths since.
        ((("a", "expired"), ("b", "expired")), "a", True),
        # Rejected long ago, then a fully automatic loop: broken all the same.
        ((("b", "rejected"), ("a", "expired"), ("b", "expired")), "a", True),
        # The rejection lies inside the loop: a consumer's choice, it goes on.
        ((("a", "expired"), ("b", "rejected")), "a", False),
        ((("a", "rejected"), ("b", "expired")), "a", False),
        # Never died in the target.
        ((("a", "expired"), ("b", "maxlen")), "c", False),
        # A second death in the same queue moves its entry to the front (count 2).
        ((("a", "expired"), ("b", "rejected"), ("a", "expired")), "a", True),
    ],
)
def test_a_loop_is_broken_unless_a_rejection_lies_inside_it(
    deaths: tuple[tuple[str, str], ...], target: str, cycle: bool
) -> None:
    *before, (last_queue, last_reason) = deaths
    payload = _died(_BODY, *before).payload
    assert (target in _died(payload, (last_queue, last_reason)).looped) is cycle
    # A rejection now is always a consumer's choice.
    assert not _died(payload, (last_queue, "rejected")).looped


def _arrived_in_order(queue: QueueType, total: int) -> None:
    """``queue`` holds the ``total`` messages whose bodies are their numbers, in order."""
    queue.attach("d", ack_required=False)
    messages, _ = queue.credit("d", 0, total, False)
    assert [
        m.payload.endswith(encode(Described(0x77, str(i)))) for i, m in enumerate(messages)
    ] == [True] * total


def _ping_pong(ttl: int) -> QueueRegistry:
    """Queues ``a`` and ``b`` dead-lettering to each other, both with ``ttl``."""
    registry = QueueRegistry(Clock(1_000))
    for name, other in (("a", "b"), ("b", "a")):
        registry.declare_queue(
            name,
            {
                "x-message-ttl": ttl,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": other,
            },
        )
    return registry


def test_a_ttl_0_loop_after_one_rejection_ends_in_a_few_bounded_passes() -> None:
    # The hostile case: b's consumer rejects once, then a and b expire it to each other at
    # once (x-message-ttl 0). It looped inside one call for ever.
    registry = _ping_pong(0)
    registry.queue("b").enqueue(Message(_died(_BODY, ("b", "rejected")).payload))
    passes = 0
    while registry.dead_letters:
        passes += 1
        registry.route_dead_letters()
        assert passes <= 2
    # b expires it to a; a's expiry back to b closes a loop with no rejection inside (b's own
    # rejection came before it expired there): dropped.
    assert passes == 2
    assert sum(s.ready for s in registry.statistics()) == 0
    assert registry.dead_letter_router.dropped == 1


def test_a_rejection_in_the_loop_keeps_the_message_going_one_pass_at_a_time() -> None:
    # b rejects, a expires at once, back in b (where its consumer may reject again).
    registry = QueueRegistry(Clock(1_000))
    registry.declare_queue(
        "a", {"x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"}
    )
    b = registry.declare_queue(
        "b", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"}
    )
    b.enqueue(Message(_BODY, routing_key="b"))
    b.attach("c", ack_required=True)
    delivery_count = 0
    for _ in range(3):
        registry.route_dead_letters()
        assert not registry.dead_letters
        [message], reply = b.credit("c", delivery_count, 1, False)
        assert reply is not None
        delivery_count = reply.delivery_count
        b.settle("c", [message.seq], Outcome.REJECTED, False)
        # One call routes b's rejection to a, whose expiry waits for the next call.
        registry.route_dead_letters()
        assert len(registry.dead_letters) == 1
    registry.route_dead_letters()
    [message], _ = b.credit("c", delivery_count, 1, False)
    counts = {
        (d[Symbol("queue")], d[Symbol("reason")]): d[Symbol("count")]
        for d in deaths_of(message.payload)
    }
    assert counts == {("b", Symbol("rejected")): 3, ("a", Symbol("expired")): 3}


def test_a_pass_routes_a_bounded_batch_and_the_rest_waits_in_order() -> None:
    registry = QueueRegistry(Clock(1_000))
    registry.declare_queue("dead")
    work = registry.declare_queue(
        "work",
        {"x-message-ttl": 10, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"},
    )
    total = LETTERS_PER_PASS * 2 + 5
    for index in range(total):
        work.enqueue(Message(encode(Described(0x77, str(index)))))
    registry.clock.now += 10
    registry.expire()
    assert len(registry.dead_letters) == total
    routed = []
    while registry.dead_letters:
        before = len(registry.dead_letters)
        registry.route_dead_letters()
        routed.append(before - len(registry.dead_letters))
    assert routed == [LETTERS_PER_PASS, LETTERS_PER_PASS, 5]
    _arrived_in_order(registry.queue("dead"), total)


def test_a_pass_stores_a_bounded_number_of_copies_whatever_the_fanout() -> None:
    """Adversary seed 66005: 1,000 messages at their delivery limit, dead-lettered into a
    fanout of 50 queues, made 25,600 copies in one pass (512 letters), 0.4 s of a loaded
    machine's reactor, and the prober could not connect. A pass stops once its copies reach
    the bound; the rest of the letters go on at the next passes, in their order."""
    registry = QueueRegistry(Clock(1_000))
    width = 50
    registry.declare_exchange("fx", "fanout")
    for index in range(width):
        registry.declare_queue(f"f{index}")
        registry.bind("fx", f"f{index}")
    source = registry.declare_queue("source", {"x-dead-letter-exchange": "fx"})
    total = 1_000
    for index in range(total):
        source.enqueue(Message(encode(Described(0x77, str(index)))))
    source.attach("c", ack_required=True)
    taken, _ = source.credit("c", 0, total, True)
    source.settle("c", [m.seq for m in taken], Outcome.REJECTED, True)
    assert len(registry.dead_letters) == total
    while registry.dead_letters:
        registry.route_dead_letters()
        # The letter that reaches the bound is stored whole: one letter's copies past it.
        assert 0 < registry.dead_letter_router.copies <= COPIES_PER_PASS + width - 1
    _arrived_in_order(registry.queue(f"f{width - 1}"), total)


def test_a_pass_takes_a_bounded_amount_of_letters_heads() -> None:
    """Adversary seed 65825: letters carrying 64 KiB of message annotations (4,000 entries)
    cost 12.8 ms each to record a death in, so a pass of 512 held the reactor for seconds and
    a prober round took 2.08 s. A pass stops once the bytes before the bodies of its letters
    reach the bound, its first letter's all the same; the rest go on at the next passes, in
    order."""
    registry = QueueRegistry(Clock(1_000))
    registry.declare_queue("dead")
    source = registry.declare_queue(
        "source", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    )
    annotations = encode(Described(0x72, {Symbol(f"x-k{i}"): i for i in range(4000)}))
    assert len(annotations) > 64_000
    total = 20
    for index in range(total):
        source.enqueue(Message(annotations + encode(Described(0x77, str(index)))))
    source.attach("c", ack_required=True)
    taken, _ = source.credit("c", 0, total, True)
    source.settle("c", [m.seq for m in taken], Outcome.REJECTED, True)
    assert len(registry.dead_letters) == total
    passes = 0
    while registry.dead_letters:
        passes += 1
        registry.route_dead_letters()
        # The letter that reaches the bound is taken whole: one letter's past it.
        taken_bytes = registry.dead_letter_router.head_bytes
        assert 0 < taken_bytes < HEAD_BYTES_PER_PASS + len(annotations)
    assert passes >= total * len(annotations) // (HEAD_BYTES_PER_PASS + len(annotations))
    _arrived_in_order(registry.queue("dead"), total)


def _fanout_back(registry: QueueRegistry) -> None:
    """Two queues dead-lettering to a fanout exchange bound to both: each rejection doubles."""
    registry.declare_exchange("fx", "fanout")
    for name in ("q1", "q2"):
        registry.declare_queue(name, {"x-dead-letter-exchange": "fx"})
        registry.bind("fx", name)


def test_copies_past_the_room_wait_and_a_move_to_one_queue_needs_room_for_its_death() -> None:
    registry = QueueRegistry(Clock(1_000))
    _fanout_back(registry)
    q1 = registry.queue("q1")
    for _ in range(3):
        q1.enqueue(Message(_BODY))
    q1.attach("c", ack_required=True)
    messages, _ = q1.credit("c", 0, 3, False)
    q1.settle("c", [m.seq for m in messages], Outcome.REJECTED, False)
    held = registry.held.total
    # Two copies of a held message share one payload and grow the count by one copy's
    # overhead (and the death record the payload gains): room for one letter, not two.
    dead = len(record_death(_BODY, Death("q1", "rejected", "", ("",), 0)).payload)
    copy = dead - len(_BODY) + MESSAGE_OVERHEAD
    registry.route_dead_letters(room=copy + copy // 2)
    assert len(registry.dead_letters) == 2
    assert registry.dead_letter_router.waiting
    assert registry.held.total - held <= copy + copy // 2
    registry.route_dead_letters(room=0)
    assert len(registry.dead_letters) == 2
    assert registry.held.total - held <= copy + copy // 2
    # A letter to one queue moves its message: it needs room for its death record only.
    registry.unbind("fx", "q2")
    registry.route_dead_letters(room=0)
    assert len(registry.dead_letters) == 2
    registry.route_dead_letters(room=2 * (dead - len(_BODY)))
    assert not registry.dead_letters
    assert not registry.dead_letter_router.waiting


def test_a_letter_waiting_for_room_is_weighed_again_only_once_something_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Weighed at every pass, a letter of 100 KB of annotations had its death recorded again,
    23-34 ms, at each pass for as long as the budget stayed full. It is weighed again once the
    room grew to what it needed, the topology changed, or after WAITING_PASSES passes."""
    registry = QueueRegistry(Clock(1_000))
    _fanout_back(registry)
    q1 = registry.queue("q1")
    q1.enqueue(Message(_BODY))
    q1.attach("c", ack_required=True)
    messages, _ = q1.credit("c", 0, 1, False)
    q1.settle("c", [messages[0].seq], Outcome.REJECTED, False)
    recorded: list[bytes] = []

    def counted(payload: bytes, death: Death) -> Recorded:
        recorded.append(payload)
        return record_death(payload, death)

    monkeypatch.setattr(dead_lettering, "record_death", counted)
    registry.route_dead_letters(room=0)
    assert registry.dead_letter_router.waiting
    assert len(recorded) == 1
    for _ in range(WAITING_PASSES):
        registry.route_dead_letters(room=1)
    assert len(recorded) == 1
    registry.route_dead_letters(room=1)
    assert len(recorded) == 2
    registry.declare_queue("elsewhere")
    registry.route_dead_letters(room=1)
    assert len(recorded) == 3
    registry.route_dead_letters(room=1)
    assert len(recorded) == 3
    registry.route_dead_letters(room=1_000_000)
    assert len(recorded) == 4
    assert not registry.dead_letters


def test_letters_waiting_for_room_weigh_their_queue_and_a_refused_publish_is_counted() -> None:
    registry = QueueRegistry(Clock(1_000))
    registry.declare_exchange("fx", "fanout")
    for name in ("s1", "s2"):
        registry.declare_queue(name)
        registry.bind("fx", name)
    registry.declare_queue("dropping", {"x-max-length": 0, "x-dead-letter-exchange": "fx"})
    registry.declare_queue(
        "refusing",
        {"x-max-length": 0, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "fx"},
    )
    dropping, refusing = registry.queue("dropping"), registry.queue("refusing")
    size = len(_BODY)
    before = registry.held.total
    dropping.enqueue(Message(_BODY))
    with pytest.raises(AmqpError):
        refusing.enqueue(Message(_BODY))
    # Neither queue holds a ready message, yet their letters pile up on the way out: they
    # weigh the queues' publishers (gateway/publishing.py) and count in the bytes held.
    assert dropping.statistics().ready_bytes == refusing.statistics().ready_bytes == 0
    assert dropping.statistics().dead_lettering_bytes == size
    assert refusing.statistics().dead_lettering_bytes == size
    assert registry.held.total - before == 2 * (size + MESSAGE_OVERHEAD)
    registry.route_dead_letters(room=0)
    assert len(registry.dead_letters) == 2
    registry.route_dead_letters(room=None)
    assert not registry.dead_letters
    assert dropping.statistics().dead_lettering_bytes == 0
    assert refusing.statistics().dead_lettering_bytes == 0
    dead = len(record_death(_BODY, Death("dropping", "maxlen", "", ("",), 0)).payload)
    # Two copies of each letter in s1 and s2, sharing its payload, the letters themselves gone.
    assert registry.held.total - before == 2 * (dead + 2 * MESSAGE_OVERHEAD)


def test_letters_a_consumer_made_are_charged_to_its_cause_per_copy_until_they_leave() -> None:
    registry = QueueRegistry(Clock(1_000))
    _fanout_back(registry)
    registry.declare_queue("expiring", {"x-message-ttl": 10, "x-dead-letter-exchange": "fx"})
    q1 = registry.queue("q1")
    for _ in range(3):
        q1.enqueue(Message(_BODY))
    registry.queue("expiring").enqueue(Message(_BODY))
    q1.attach("c", ack_required=True)
    messages, _ = q1.credit("c", 0, 3, False)
    # Any cause will do: an account borrows and repays as a link's share of a debt does.
    account = Account(limit=4)
    router = registry.dead_letter_router
    since = len(registry.dead_letters)
    q1.settle("c", [m.seq for m in messages], Outcome.REJECTED, False)
    # One unit a letter while its copies are not known: under the limit of 4.
    assert router.blame(since, account) is False
    assert (account.debt, account.paused) == (3, False)
    # A letter of expiry has no client cause: nothing is charged for it.
    registry.clock.now += 20
    registry.expire()
    assert len(registry.dead_letters) == 4
    assert account.debt == 3
    # No room: the first letter waits and now owes its two copies, which reaches the limit:
    # the cause is named for the gateway to hold its consumer (session/dead_letter_debt.py).
    registry.route_dead_letters(room=0)
    assert len(registry.dead_letters) == 4
    assert (account.debt, account.paused) == (4, True)
    assert router.toggled == [account]
    registry.route_dead_letters(room=0)
    assert account.debt == 4
    assert router.toggled == [account]
    # Room: the copies are stored, every unit is repaid and the cause named again, to let go.
    registry.route_dead_letters()
    assert not registry.dead_letters
    assert (account.debt, account.paused) == (0, False)
    assert router.toggled == [account, account]


def test_a_long_auto_delete_cascade_is_deleted_without_recursion() -> None:
    registry = QueueRegistry()
    registry.declare_queue("end")
    registry.declare_exchange("kept", "fanout")
    length = sys.getrecursionlimit() * 2
    for index in range(length):
        registry.declare_exchange(f"x{index}", "fanout", auto_delete=True)
        registry.bind("kept", f"x{index}", to_exchange=True)
    for index in range(length - 1):
        registry.bind(f"x{index}", f"x{index + 1}", to_exchange=True)
    registry.bind(f"x{length - 1}", "end")
    registry.delete_queue("end")
    assert [e.name for e in registry.exchanges() if e.name.startswith(("x", "kept"))] == ["kept"]
    assert registry.binding_count == 0
    # The graph is whole: binding and deleting again works as before.
    registry.declare_queue("again")
    registry.bind("kept", "again")
    assert [q.name for q in registry.route("kept", "")] == ["again"]
    registry.delete_exchange("kept")
    assert registry.binding_count == 0


def test_a_letter_a_target_has_no_room_for_waits_in_its_queue_until_it_fits() -> None:
    # A queue on another worker takes a window of letters until its owner confirms them
    # (docs/workers.md): while the window is full the letter waits, its message in its queue.
    registry = QueueRegistry(Clock(1_000))
    registry.declare_queue("dead")
    work = registry.declare_queue(
        "work",
        {"x-message-ttl": 10, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"},
    )
    work.enqueue(Message(_BODY))
    registry.clock.now += 10
    registry.expire()
    asked: list[tuple[str, int]] = []
    room = False

    def fits(queues: list[QueueType], size: int) -> int:
        asked.extend((queue.name, size) for queue in queues)
        return len(queues) if room else 0

    registry.dead_letter_router.fits = fits
    registry.route_dead_letters()
    assert registry.dead_letter_router.waiting
    assert len(registry.dead_letters) == 1
    assert registry.queue("dead").statistics().ready == 0
    assert work.statistics().dead_lettering_bytes > 0
    room = True
    registry.route_dead_letters()
    assert not registry.dead_letters
    assert registry.queue("dead").statistics().ready == 1
    # Asked with the letter's bytes: its death recorded, so more than the body.
    name, size = asked[-1]
    assert name == "dead"
    assert size > len(_BODY)


def test_a_letter_to_several_queues_is_weighed_copy_by_copy() -> None:
    # Every copy to another worker's queue joins its channel's window with the copies before
    # it: a letter to ten remote queues, each weighed alone, took 3.9 MB into a 1 MiB window
    # (adversary seed 65701's replay). The window's side: test_channel_letter_window.py.
    registry = QueueRegistry(Clock(1_000))
    registry.declare_exchange("fx", "fanout")
    for index in range(3):
        registry.declare_queue(f"copy{index}")
        registry.bind("fx", f"copy{index}")
    work = registry.declare_queue("work", {"x-message-ttl": 10, "x-dead-letter-exchange": "fx"})
    body = encode(Described(0x77, "b" * 10_000))
    work.enqueue(Message(body))
    registry.clock.now += 10
    registry.expire()
    asked: list[tuple[int, int]] = []

    def fits(queues: list[QueueType], size: int) -> int:
        asked.append((len(queues), size))
        return min(2, len(queues))

    registry.dead_letter_router.fits = fits
    registry.route_dead_letters()
    # The first two went; the third waits, its message still in its queue.
    assert [registry.queue(f"copy{n}").statistics().ready for n in range(3)] == [1, 1, 0]
    assert registry.dead_letter_router.waiting
    assert work.statistics().dead_lettering_bytes == len(body)
    registry.route_dead_letters()
    assert [registry.queue(f"copy{n}").statistics().ready for n in range(3)] == [1, 1, 1]
    assert work.statistics().dead_lettering_bytes == 0
    # Asked first with the payload as it is, not copied while nothing fits, then with its
    # death recorded: more than the body.
    assert asked == [(3, len(body)), (3, asked[1][1]), (1, len(body)), (1, asked[3][1])]
    assert min(asked[1][1], asked[3][1]) > len(body)


def test_copies_refused_into_letters_of_their_own_take_the_passes_room() -> None:
    # A letter's copies that full reject-publish-dlx queues refuse are counted again, as those
    # queues' letters: the pass takes its room by what each letter grew the held bytes by in
    # fact, and passes it by one letter at most.
    registry = QueueRegistry(Clock(1_000))
    registry.declare_exchange("fx", "fanout")
    registry.declare_exchange("sink", "fanout")
    registry.declare_queue("source", {"x-dead-letter-exchange": "fx"})
    for index in range(10):
        name = f"full{index}"
        registry.declare_queue(
            name,
            {
                "x-max-length": 0,
                "x-overflow": "reject-publish-dlx",
                "x-dead-letter-exchange": "sink",
            },
        )
        registry.bind("fx", name)
    source = registry.queue("source")
    body = encode(Described(0x77, "b" * 10_000))
    for _ in range(20):
        source.enqueue(Message(body))
    source.attach("c", ack_required=True)
    messages, _ = source.credit("c", 0, 20, False)
    source.settle("c", [m.seq for m in messages], Outcome.REJECTED, False)
    held = registry.held.total
    room = 30_000
    registry.route_dead_letters(room=room)
    letter = len(body) + 400 + 10 * 2 * MESSAGE_OVERHEAD
    assert registry.held.total - held <= room + letter
    assert registry.dead_letter_router.waiting
