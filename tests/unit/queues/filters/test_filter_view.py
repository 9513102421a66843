"""A message's filter view: decoded once however many filters read it, only the parts they
read, and no more views kept than the cache's budget."""

from __future__ import annotations

from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.selector import parse_selector
from sluicegate.queues.filters.sql import parse_sql
from sluicegate.queues.filters.stream_filter import StreamFilter
from sluicegate.queues.filters.view import (
    APPLICATION_PART,
    HEADER_PART,
    PROPERTIES_PART,
    VIEW_OVERHEAD,
    ViewCache,
)
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, MessageFilter
from sluicegate.wire.amqp_types import Described, Symbol, Value
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import Header, encode_header


def _message(
    application: dict[Value, Value], annotations: dict[Value, Value] | None = None
) -> Message:
    payload = encode_header(Header(priority=6))
    if annotations is not None:
        payload += b"\x00\x53\x72" + encode(annotations)
    payload += b"\x00\x53\x73" + encode(["id", None, None, "subject"])
    payload += b"\x00\x53\x74" + encode(application)
    return Message(payload + encode(Described(0x77, "body")))


def test_ten_filters_decode_a_message_once() -> None:
    views = ViewCache()
    clock = Clock()
    filters: list[MessageFilter] = [
        PropertiesFilter(views, None, {"region": f"r{i}"}) for i in range(4)
    ]
    filters += [parse_selector(f"region = 'r{i}'", views, clock) for i in range(3)]
    filters += [
        parse_sql(f"region = 'r{i}' AND p.subject = 'subject'", views, clock) for i in range(3)
    ]
    messages = [_message({"region": "eu", "payload": "x" * 1000}) for _ in range(30)]
    for accept in filters:
        assert not any(accept(m) for m in messages)
    stats = views.statistics()
    # Each message once for its application properties, once more for the SQL filters'
    # properties section; every other read is a hit.
    assert stats.decodes == 60
    assert stats.hits == 10 * 30 - 60
    assert stats.views == 30


def test_only_the_parts_read_are_decoded() -> None:
    views = ViewCache()
    message = _message({"region": "eu"}, {Symbol("x-stream-filter-value"): "blue"})
    assert parse_sql("h.priority = 6", views, Clock())(message)
    view = message.view
    assert view is not None
    assert view.parts == HEADER_PART
    assert view.application == {}
    assert StreamFilter(["blue"], False, views)(message)
    assert view.filter_value == "blue"
    assert view.parts & (PROPERTIES_PART | APPLICATION_PART) == 0


def test_the_cache_keeps_views_within_its_budget_and_decodes_evicted_ones_again() -> None:
    budget = 20_000
    views = ViewCache(budget)
    accept = PropertiesFilter(views, None, {"k": "v"})
    messages = [_message({"k": "v", "pad": "x" * 500}) for _ in range(100)]
    for message in messages:
        assert accept(message)
        assert views.cost <= budget
    stats = views.statistics()
    assert stats.evictions > 0
    assert stats.views * VIEW_OVERHEAD <= budget
    # The oldest were forgotten: reading one again decodes it again.
    first = messages[0].view
    assert first is not None
    assert first.parts == 0
    assert accept(messages[0])
    assert views.statistics().decodes == 101


def test_a_message_that_does_not_decode_is_selected_by_nothing() -> None:
    views = ViewCache()
    broken = Message(b"\x00\x53\x74\xc1\x05\x02\xa1\x01")
    assert not PropertiesFilter(views, None, {"a": None})(broken)
    assert not parse_sql("a IS NULL", views, Clock())(broken)
    assert views.statistics().decodes == 1
