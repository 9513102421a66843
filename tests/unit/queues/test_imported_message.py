"""Another worker's deliveries as the consumer's worker holds them (queues/message.py)."""

from __future__ import annotations

import pytest

from sluicegate.queues.message import AVAILABLE, Message, imported, send_all
from sluicegate.wire.sections import with_delivery_count


def test_an_imported_delivery_is_sent_as_its_bytes_and_settled_by_its_sequence_number() -> None:
    payloads = [b"\x00Sp\xc0\x02\x01A" + b"x" * size for size in (0, 5, 300)]
    messages = imported([7, 8, 9], payloads)
    assert [message.seq for message in messages] == [7, 8, 9]
    for message, payload in zip(messages, payloads, strict=True):
        assert isinstance(message, Message)
        assert message.read() is payload
        assert message.send() is payload
        assert message.read_size() == message.held == len(payload)
        assert message.state == AVAILABLE
        assert message.delivery_count == message.returned == 0


def test_an_imported_delivery_changes_nothing_but_its_own_two_fields() -> None:
    (message,) = imported([1], [b"abc"])
    message.seq = 2
    assert message.seq == 2
    with pytest.raises(AttributeError):
        message.delivery_count = 1
    with pytest.raises(AttributeError):
        message.state = 0


def test_send_all_reads_a_stamped_message_and_hands_a_plain_ones_payload_as_it_is() -> None:
    payload = b"\x00Sp\xc0\x04\x02AP\x00" + b"\x00Sw\xa1\x02hi"
    plain = Message(payload, 0, 1)
    returned = Message(payload, 0, 2)
    returned.count_failed_delivery()
    sent = send_all([plain, returned])
    assert sent[0] is payload
    assert sent[1] == with_delivery_count(payload, 1) != payload
