"""A durable classic queue that pages its backlog, against a model (docs/durability.md, "Paging").

The queue keeps two ready messages resident and pages the rest: persistent ones as record
positions in the log (:class:`queues.log.paged.DiskPage`), transient ones in memory. Commands
publish both kinds, grant credit, settle, purge, group-commit and restart over the same log.
Whatever the pages do, consumers get exactly the model's messages in publication order
(released ones back at their place), the counts agree, paged messages cost a few bytes of
the memory budget, and a restart brings back exactly the persistent messages not settled.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.examples import examples

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.log.segments import SegmentWriter
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import Header, encode_header

# Small segments, so that pages end where segments roll and compaction runs.
_SEGMENT_SIZE = 2048
_CONSUMER = "consumer"


def _body(number: int) -> bytes:
    return encode(Described(0x77, f"message {number} " + "x" * (number % 5) * 30))


def _payload(number: int, durable: bool) -> bytes:
    return encode_header(Header(durable=durable)) + _body(number)


class PagingModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="sluicegate-paging-"))
        self.writer = SegmentWriter(self.directory)
        self.store = MessageStore(self.directory, segment_size=_SEGMENT_SIZE, cache_bytes=512)
        self.queue = self._declare()
        self.published = 0
        # Publication number → durable?; the ready ones and those the consumer holds.
        self.durable: dict[int, bool] = {}
        self.ready: list[int] = []
        self.held: dict[int, int] = {}  # publication number → the delivery's sequence number
        self.delivered: dict[int, Message] = {}  # publication number → the delivery held
        self.failures: dict[int, int] = {}
        self.delivery_count = 0

    def _declare(self) -> ClassicQueue:
        self.store.declare_queue("q", {})
        queue = ClassicQueue("q")
        queue.pager = self.store.pager("q")
        queue.resident_ready = 2
        queue.attach(_CONSUMER, ack_required=True)
        self.delivery_count = 0
        return queue

    def teardown(self) -> None:
        self.store.close()
        self.writer.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(count=st.integers(1, 6), durable=st.lists(st.booleans(), min_size=6, max_size=6))
    def publish(self, count: int, durable: list[bool]) -> None:
        for persistent in durable[:count]:
            self.published += 1
            number = self.published
            payload = _payload(number, persistent)
            message: Message = (
                self.store.enqueue("q", payload, number) if persistent else Message(payload)
            )
            self.durable[number] = persistent
            self.ready.append(number)
            assert self.queue.enqueue(message) == []

    @rule(credit=st.integers(1, 8))
    def consume(self, credit: int) -> None:
        delivered, reply = self.queue.credit(_CONSUMER, self.delivery_count, credit, True)
        self.delivery_count = reply.delivery_count
        expected = self.ready[:credit]
        del self.ready[: len(delivered)]
        assert len(delivered) == len(expected)
        for number, message in zip(expected, delivered, strict=True):
            payload = message.read()
            assert payload.endswith(_body(number))
            # Compaction may delete old acquire/return records (queues.log.ledger): a recovered
            # count can fall short of the attempts, never exceed them.
            failures = self.failures.get(number, 0)
            assert message.delivery_count <= failures
            self.failures[number] = message.delivery_count
            self.held[number] = message.seq
            self.delivered[number] = message

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from([Outcome.ACCEPTED, Outcome.RELEASED]))
    def settle(self, data: st.DataObject, outcome: Outcome) -> None:
        number = data.draw(st.sampled_from(sorted(self.held)))
        failed = data.draw(st.booleans()) and outcome is Outcome.RELEASED
        seq = self.held.pop(number)
        self.queue.settle(_CONSUMER, [seq], Outcome.MODIFIED if failed else outcome, failed)
        if outcome is Outcome.RELEASED:
            self.ready.append(number)
            self.ready.sort()
            if failed:
                self.failures[number] = self.failures.get(number, 0) + 1

    @rule()
    def purge(self) -> None:
        assert self.queue.purge() == len(self.ready)
        self.ready.clear()

    @rule()
    def flush(self) -> None:
        write_now(self.store, self.writer)

    @rule()
    def restart(self) -> None:
        """A clean restart: everything written, then the log recovered into fresh pages."""
        self.flush()
        self.store.close()
        self.writer.close()
        self.store = MessageStore(self.directory, segment_size=_SEGMENT_SIZE, cache_bytes=512)
        self.writer = SegmentWriter(self.directory)
        self.queue = self._declare()
        self.queue.restore(self.store)
        # Transient messages are gone; held persistent ones come back with a failed delivery.
        for number in self.held:
            self.failures[number] = self.failures.get(number, 0) + 1
        kept = [n for n in [*self.ready, *self.held] if self.durable[n]]
        self.ready = sorted(kept)
        self.held.clear()

    @invariant()
    def counts_agree(self) -> None:
        stats = self.queue.statistics()
        assert stats.ready == self.queue.available == len(self.ready)
        assert stats.unacked == len(self.held)
        # Kept as deliveries come and go, stored messages' bodies on disk or cached alike.
        assert stats.unacked_bytes == sum(self.delivered[number].held for number in self.held)

    @invariant()
    def memory_budget_accounting_returns_to_zero(self) -> None:
        total = self.queue.held.total
        assert total >= 0
        if not self.ready and not self.held:
            assert total == 0


PagingModel.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=50, deadline=None
)
test_paging_model = PagingModel.TestCase
