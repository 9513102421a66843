"""A consumer's filter set as plain values, and the filters it compiles to.

The gateway reads a link's source into a :class:`FilterSet` (gateway/consumers.py) and compiles
it here, so that a consumer of a queue another worker owns can carry the same set over the
channel and its owner compiles it exactly as a local attach does (docs/workers.md): the same
parsers, limits and errors, and a stream's own filter values indexed only where the queue is a
stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from sluicegate.queues.filters.all_of import all_of
from sluicegate.queues.filters.properties import PropertiesFilter
from sluicegate.queues.filters.selector import parse_selector
from sluicegate.queues.filters.sql import parse_sql
from sluicegate.queues.filters.stream_filter import StreamFilter
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.queue_type import Clock, MessageFilter, OffsetSpec
from sluicegate.wire.amqp_types import Value

# An expression filter's language: a JMS selector or an AMQP SQL filter.
Language = Literal["selector", "sql"]
LANGUAGES: Final[tuple[Language, ...]] = ("selector", "sql")


@dataclass(frozen=True, slots=True)
class FilterSet:
    """What a consumer's filter set asks for, read but not compiled.

    ``expressions`` keeps the selectors and SQL filters in the order the client named them.
    """

    offset: OffsetSpec | None = None
    properties: dict[str, Value] | None = None
    application: dict[str, Value] | None = None
    expressions: tuple[tuple[Language, str], ...] = ()
    values: tuple[str, ...] | None = None
    match_unfiltered: bool = False

    @property
    def empty(self) -> bool:
        """Nothing to filter on and no start to seek: a consumer as without a filter set."""
        return (
            self.offset is None
            and self.properties is None
            and self.application is None
            and not self.expressions
            and self.values is None
        )


@dataclass(frozen=True, slots=True)
class Compiled:
    """A filter set's filters: ``filter`` for every queue, ``stream_filter`` for a stream that
    applies the values from its chunk filters itself."""

    filter: MessageFilter | None
    stream_filter: StreamFilter | None


def compile_filters(
    filters: FilterSet, views: ViewCache, clock: Clock, *, indexes_filter_values: bool
) -> Compiled:
    """Parse the set's expressions and build its filters; raises
    :class:`~queues.errors.InvalidFilter` for one malformed or beyond its limits."""
    compiled: list[MessageFilter] = [
        parse_selector(text, views, clock)
        if language == "selector"
        else parse_sql(text, views, clock)
        for language, text in filters.expressions
    ]
    if filters.properties is not None or filters.application is not None:
        compiled.insert(0, PropertiesFilter(views, filters.properties, filters.application))
    stream_filter = None
    if filters.values is not None:
        stream_filter = StreamFilter(list(filters.values), filters.match_unfiltered, views)
        if not indexes_filter_values:
            compiled.insert(0, stream_filter)
    return Compiled(all_of(compiled), stream_filter if indexes_filter_values else None)
