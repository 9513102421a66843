"""Management's questions to a queue's owner across the channel (docs/workers.md): one count per
queue out at a time, purges capped, every answer matched to its question, and a stand-in that
reads its owner's figures within a request and zeros outside (so one scrape adds up)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from support.placement import AllHere

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.errors import PreconditionFailed
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.codec import ChannelError, FrameReader, encode
from sluicegate.session.channel.frames import (
    ANSWER_COUNTS,
    Answer,
    Attach,
    Detach,
    Frame,
    Query,
    QueryOp,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.queries import (
    MAX_PURGES,
    Figures,
    Questions,
    counts_of,
    no_counts,
    statistics_of,
)
from sluicegate.session.channel.remote import Remote, RemoteQueue, management_statistics
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp

_ZEROS = (0,) * ANSWER_COUNTS


def _answer(query: Query, ready: int = 0) -> Answer:
    counts = counts_of(QueueStatistics(query.queue, ready, 0, 0, 0, 0, 0, 0))
    return Answer(query.query, True, 0, counts)


def test_an_answer_carries_every_count_a_queue_reports() -> None:
    assert len(fields(QueueStatistics)) - 1 == ANSWER_COUNTS
    stream = QueueStatistics("s", 1, 2, 3, 4, 5, 6, 7, first_offset=0, last_offset=9)
    assert statistics_of("s", counts_of(stream)) == stream
    assert statistics_of("s", counts_of(stream)).next_offset is None


def test_a_count_asked_while_out_joins_the_one_out() -> None:
    questions = Questions()
    first, query = questions.ask(QueryOp.COUNTS, "/", "q")
    again, none = questions.ask(QueryOp.COUNTS, "/", "q")
    assert query is not None
    assert none is None
    assert again is first
    # A stat is use: it goes out even while a count of the same queue is.
    stat, stat_query = questions.ask(QueryOp.STAT, "/", "q")
    assert stat is not first
    assert stat_query is not None
    assert len(questions) == 2
    assert questions.answered(_answer(query, ready=4)) is first
    assert first.answer is not None
    assert not stat.done
    # Answered: the next asker gets a question of its own.
    _, fresh = questions.ask(QueryOp.COUNTS, "/", "q")
    assert fresh is not None
    assert fresh.query != query.query


def test_an_answer_nobody_asked_for_ends_the_channel() -> None:
    questions = Questions()
    _, query = questions.ask(QueryOp.COUNTS, "/", "q")
    assert query is not None
    with pytest.raises(ChannelError, match="not out"):
        questions.answered(Answer(query.query + 1, True, 0, _ZEROS))
    questions.answered(_answer(query))
    with pytest.raises(ChannelError, match="not out"):
        questions.answered(_answer(query))


def test_purges_are_never_joined_and_at_most_max_purges_are_out() -> None:
    questions = Questions()
    sent = [questions.ask(QueryOp.PURGE, "/", "q") for _ in range(MAX_PURGES)]
    assert len({query.query for _, query in sent if query is not None}) == MAX_PURGES
    refused, none = questions.ask(QueryOp.PURGE, "/", "q")
    assert none is None
    assert refused.error is not None
    assert "purges" in refused.error
    first = sent[0][1]
    assert first is not None
    questions.answered(Answer(first.query, True, 3, _ZEROS))
    _, room = questions.ask(QueryOp.PURGE, "/", "q")
    assert room is not None


def test_a_lost_channel_fails_every_question_and_a_missing_queue_says_so() -> None:
    questions = Questions()
    missing, query = questions.ask(QueryOp.COUNTS, "/", "gone")
    assert query is not None
    questions.answered(Answer(query.query, False, 0, _ZEROS))
    assert missing.missing
    assert missing.error is not None
    # Its deletion is on its way to the stand-in: the request reads zeros, it does not fail.
    figures = Figures()
    figures.asked[("/", "gone", "counts")] = missing
    assert figures.failure is None
    out = [questions.ask(op, "/", "q")[0] for op in QueryOp]
    questions.lost("worker 1 ended")
    ended = [("worker 1 ended", False)] * len(QueryOp)
    assert [(asked.error, asked.missing) for asked in out] == ended
    assert len(questions) == 0
    assert questions.purges == 0


class Owned:
    """Worker B's queue ``q`` in a registry, and the owner's side of one channel to it."""

    def __init__(self) -> None:
        self.registry = QueueRegistry()
        self.queue = self.registry.declare_queue("q", durable=False)
        self.used: list[str] = []
        self.owner = Owner(
            self._find, 16, lambda vhost, name: self.used.append(name), delete=self._delete
        )

    def _delete(self, vhost: str, name: str) -> int:
        return self.registry.delete_queue(name)

    def _find(self, vhost: str, name: str) -> ClassicQueue | None:
        queue = self.registry.get(name)
        return queue if isinstance(queue, ClassicQueue) else None

    def publish(self, count: int) -> None:
        for n in range(count):
            self.queue.enqueue(Message(amqp(Described(0x77, f"m{n}"))))

    def ask(self, op: QueryOp, name: str = "q") -> Answer:
        frames, local = self.owner.receive(Query(7, op, "/", name))
        assert local == []
        (answer,) = frames
        assert isinstance(answer, Answer)
        return answer


def test_the_owner_answers_counts_a_stat_is_use_and_a_purge_drops_the_ready() -> None:
    owned = Owned()
    owned.publish(5)
    counts = owned.ask(QueryOp.COUNTS)
    assert (counts.found, counts.purged, statistics_of("q", counts.counts).ready) == (True, 0, 5)
    assert owned.used == []
    owned.ask(QueryOp.STAT)
    assert owned.used == ["q"]
    purged = owned.ask(QueryOp.PURGE)
    assert (purged.purged, statistics_of("q", purged.counts).ready) == (5, 0)
    assert owned.queue.statistics().ready == 0
    assert not owned.ask(QueryOp.COUNTS, "elsewhere").found


def test_the_owner_deletes_a_queue_asked_and_answers_how_many_ready_messages_went() -> None:
    owned = Owned()
    owned.publish(6)
    deleted = owned.ask(QueryOp.DELETE)
    assert (deleted.found, deleted.purged) == (True, 6)
    assert owned.registry.get("q") is None
    # A second deletion finds nothing, as on one worker.
    again = owned.ask(QueryOp.DELETE)
    assert (again.found, again.purged) == (False, 0)
    # An owner that was given no way to delete ends the channel rather than guess.
    owned.registry.declare_queue("q", durable=False)
    with pytest.raises(ChannelError):
        Owner(owned._find, 16).receive(Query(8, QueryOp.DELETE, "/", "q"))


def test_the_owner_judges_a_declaration_and_says_whether_it_made_the_queue() -> None:
    owned = Owned()
    made: list[bytes] = []

    def declare(vhost: str, name: str, declaration: bytes) -> bool:
        made.append(declaration)
        if name == "bad":
            raise PreconditionFailed("refused")
        had = owned.registry.get(name) is not None
        owned.registry.declare_queue(name, durable=False)
        return not had

    owner = Owner(owned._find, 16, declare=declare)
    # The declaration crosses encoded, as the asker sent it.
    declaration = amqp(["queue", "new", {}, False, False])
    (query,) = FrameReader(1 << 16).feed(
        b"".join(encode(Query(1, QueryOp.DECLARE, "/", "new", declaration)))
    )
    assert owner.receive(query)[0] == [Answer(1, True, 1, counts_of(no_counts("new")))]
    assert made == [declaration]
    again = owner.receive(Query(2, QueryOp.DECLARE, "/", "new", b"\x45"))[0]
    assert again == [Answer(2, True, 0, counts_of(no_counts("new")))]
    refused = owner.receive(Query(3, QueryOp.DECLARE, "/", "bad", b"\x45"))[0]
    assert refused == [Answer(3, False, 0, counts_of(no_counts("bad")))]
    with pytest.raises(ChannelError):
        Owner(owned._find, 16).receive(Query(4, QueryOp.DECLARE, "/", "q", b"\x45"))


def test_the_judge_of_an_exchange_answers_whether_it_made_it_whatever_queues_it_has() -> None:
    owned = Owned()
    exchanges: set[str] = set()

    def declare(vhost: str, name: str, declaration: bytes) -> bool:
        if name == "bad":
            raise PreconditionFailed("inequivalent arg 'type'")
        had = name in exchanges
        exchanges.add(name)
        return not had

    owner = Owner(owned._find, 16, declare=declare)
    declaration = amqp(["exchange", "x", "fanout", {}, True, False, False])
    (query,) = FrameReader(1 << 16).feed(
        b"".join(encode(Query(1, QueryOp.DECLARE_EXCHANGE, "/", "x", declaration)))
    )
    # No queue "x" here: an exchange's answer is found all the same, with no counts.
    assert owner.receive(query)[0] == [Answer(1, True, 1, counts_of(no_counts("x")))]
    again = owner.receive(Query(2, QueryOp.DECLARE_EXCHANGE, "/", "x", declaration))[0]
    assert again == [Answer(2, True, 0, counts_of(no_counts("x")))]
    refused = owner.receive(Query(3, QueryOp.DECLARE_EXCHANGE, "/", "bad", declaration))[0]
    assert refused == [Answer(3, False, 0, counts_of(no_counts("bad")))]
    with pytest.raises(ChannelError):
        Owner(owned._find, 16).receive(Query(4, QueryOp.DECLARE_EXCHANGE, "/", "x", declaration))
    # Never joined: each declaration is judged, and counted against the purges' bound.
    questions = Questions()
    first, sent = questions.ask(QueryOp.DECLARE_EXCHANGE, "/", "x", declaration)
    second, again_sent = questions.ask(QueryOp.DECLARE_EXCHANGE, "/", "x", declaration)
    assert sent is not None
    assert again_sent is not None
    assert first is not second
    assert questions.purges == 2


def test_deletions_are_never_joined_and_share_the_purges_bound() -> None:
    questions = Questions()
    first, query = questions.ask(QueryOp.DELETE, "/", "q")
    second, again = questions.ask(QueryOp.DELETE, "/", "q")
    assert query is not None
    assert again is not None
    assert first is not second
    for _ in range(MAX_PURGES - 2):
        questions.ask(QueryOp.PURGE, "/", "q")
    refused, none = questions.ask(QueryOp.DELETE, "/", "q")
    assert none is None
    assert refused.error is not None
    figures = Figures()
    figures.asked[("/", "q", "delete")] = first
    assert figures.deleted("/", "q") is None
    questions.answered(Answer(query.query, True, 9, _ZEROS))
    assert figures.deleted("/", "q") == 9
    figures.asked[("/", "q", "delete")] = second
    questions.answered(Answer(again.query, False, 0, _ZEROS))
    # The owner no longer had it: 0, and no failure (its deletion is crossing).
    assert figures.deleted("/", "q") == 0
    assert figures.failure is None


def test_the_owner_counts_remote_consumers_and_tells_when_one_left() -> None:
    owned = Owned()
    for consumer in (1, 2):
        owned.owner.receive(Attach(consumer, "/", "q", True, False, 0))
    assert owned.owner.consumers_of(owned.queue) == 2
    assert owned.queue.statistics().consumers == 2
    owned.owner.receive(Detach(1, 0))
    assert owned.owner.consumers_of(owned.queue) == 1
    assert owned.owner.left == [("/", owned.queue)]
    owned.owner.left.clear()
    # The channel ends: its last consumer leaves too.
    owned.owner.close()
    assert owned.owner.consumers_of(owned.queue) == 0
    assert owned.owner.left == [("/", owned.queue)]


def _crossed(remote: Remote, owned: Owned) -> None:
    """The stand-in's questions cross to the owner and its answers back, encoded."""
    up, down = FrameReader(1 << 16), FrameReader(1 << 16)
    sent = b"".join(piece for frame in remote.outgoing for piece in encode(frame))
    remote.outgoing.clear()
    answers: list[Frame] = []
    for frame in up.feed(sent):
        answers.extend(owned.owner.receive(frame)[0])
    for frame in down.feed(b"".join(piece for f in answers for piece in encode(f))):
        assert isinstance(frame, Answer)
        remote.answered(frame)


def test_a_stand_in_reads_its_owners_figures_within_a_request_and_zeros_outside() -> None:
    owned = Owned()
    owned.publish(3)
    remote = Remote(1)
    remote.opened()
    stand_in = RemoteQueue("q", "/", remote)
    # Outside a request (a metrics scrape): zeros, and nothing asked.
    assert management_statistics(stand_in).ready == 0
    assert remote.outgoing == []
    figures = Figures()
    with remote.reads.using(figures):
        assert management_statistics(stand_in).ready == 0
        assert management_statistics(stand_in).ready == 0
    assert [type(frame) for frame in remote.outgoing] == [Query]
    asked_before = figures.pending
    assert asked_before
    _crossed(remote, owned)
    assert not figures.pending
    assert figures.failure is None
    # The request's next run reads the answer; what metrics read stays zero.
    with remote.reads.using(figures):
        assert management_statistics(stand_in).ready == 3
        assert remote.outgoing == []
    assert stand_in.statistics().ready == 0


def test_a_purge_through_a_stand_in_is_asked_once_and_reads_the_owners_count() -> None:
    owned = Owned()
    owned.publish(4)
    remote = Remote(1)
    remote.opened()
    stand_in = RemoteQueue("q", "/", remote)
    assert stand_in.purge() == 0
    assert remote.outgoing == []
    figures = Figures()
    with remote.reads.using(figures):
        assert stand_in.purge() == 0
    _crossed(remote, owned)
    with remote.reads.using(figures):
        assert stand_in.purge() == 4
    assert remote.outgoing == []
    assert owned.queue.statistics().ready == 0


def test_a_stand_in_whose_owner_is_not_serving_fails_at_once() -> None:
    remote = Remote(1)
    figures = Figures()
    with remote.reads.using(figures):
        RemoteQueue("q", "/", remote).owner_statistics()
    failure = figures.failure
    assert failure is not None
    assert failure.error is not None
    assert "not serving" in failure.error
    assert remote.outgoing == []


class _Placement(AllHere):
    """A registry's placement where every queue but ``here`` lives on worker 1."""

    def __init__(self, channel: Remote) -> None:
        self.channel = channel
        self.changes: list[list[object]] = []

    def remote(self, name: str) -> RemoteQueue | None:
        return None if name == "here" else RemoteQueue(name, "/", self.channel)

    def changed(self, change: list[object]) -> None:
        self.changes.append(change)

    def used(self, name: str) -> None:
        self.channel.ask(QueryOp.STAT, "/", name)


def test_a_stand_ins_use_is_told_to_its_owner_and_its_deletion_purges_nothing_here() -> None:
    remote = Remote(1)
    remote.opened()
    registry = QueueRegistry()
    placement = registry.placement = _Placement(remote)
    registry.declare_queue("far", {"x-expires": 1000})
    remote.outgoing.clear()
    # A redeclaration is use: the owner, where the lease is, hears of it.
    registry.declare_queue("far", {"x-expires": 1000})
    assert remote.outgoing == [Query(1, QueryOp.STAT, "/", "far")]
    assert registry.next_deadline() is None
    remote.outgoing.clear()
    registry.delete_queue("far")
    assert remote.outgoing == []
    assert registry.get("far") is None
    assert placement.changes[-1] == ["delete-queue", "far"]
