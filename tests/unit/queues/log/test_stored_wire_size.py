"""A message's reported wire size is the length of the bytes sent, whatever happened to it.

A multi-frame delivery is sliced by :meth:`read_size` (session/outbound.py), so a size that
misses the header a raised delivery-count rewrites truncates the message on the wire.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from sluicegate.queues.log.segments import SegmentWriter
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.message import Message
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import DEFAULT_HEADER, encode_header

_BODY = encode(Described(0x77, "b" * 300))
_WITH_HEADER = encode_header(DEFAULT_HEADER) + _BODY
_STEPS = st.lists(
    st.one_of(st.just("fail"), st.just("write"), st.text(alphabet="abc", min_size=1, max_size=20)),
    max_size=8,
)


def _annotations(value: str) -> bytes:
    return encode({Symbol("x-opt-" + value[:1]): value})


def test_a_stored_message_without_a_header_counts_the_one_a_failure_inserts(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path)
    store.declare_queue("q", {})
    message = store.enqueue("q", _BODY, 0)
    store.acquired(message)
    message.count_failed_delivery()
    assert len(message.send()) > len(_BODY)
    assert message.read_size() == len(message.send())


@settings(max_examples=examples(60), deadline=None)
@given(header=st.booleans(), steps=_STEPS)
def test_read_size_is_the_length_of_the_bytes_sent(header: bool, steps: list[str]) -> None:
    payload = _WITH_HEADER if header else _BODY
    plain = Message(payload)
    with tempfile.TemporaryDirectory() as directory:
        store = MessageStore(Path(directory))
        writer = SegmentWriter(Path(directory))
        store.declare_queue("q", {})
        stored = store.enqueue("q", payload, 0)
        for step in steps:
            if step == "fail":
                stored.count_failed_delivery()
                plain.count_failed_delivery()
            elif step == "write":
                write_now(store, writer)
            else:
                stored.annotate(_annotations(step))
                plain.annotate(_annotations(step))
            assert stored.read_size() == len(stored.read())
            assert plain.read_size() == len(plain.read())
            assert stored.read() == plain.read()
        store.close()
