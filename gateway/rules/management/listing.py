"""Listings as RabbitMQ's HTTP API pages them, and the bound on an unpaged one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar
from urllib.parse import parse_qsl

from sluicegate.gateway.rules.management.requests import Body, Refused

T = TypeVar("T")

# RabbitMQ's HTTP API refuses pages larger than this.
MAX_PAGE_SIZE: Final = 500
# Its page size when only ``page`` is given.
DEFAULT_PAGE_SIZE: Final = 100
# An unpaged listing is built and encoded in one go, the server's clients waiting meanwhile:
# beyond this many items (some tens of milliseconds of work) it is refused with a 400 that says
# to ask for pages, which cost little whatever the total.
MAX_UNPAGED: Final = 2000


def listing(rest: list[str], items: Sequence[T], render: Callable[[T], Body]) -> Body:
    """Every item rendered, or the page of them the query asks for (RabbitMQ's paging)."""
    query = dict(parse_qsl(rest[0][1:])) if rest else {}
    if "page" not in query and "page_size" not in query:
        if len(items) > MAX_UNPAGED:
            raise Refused(
                400,
                f"{len(items)} items are too many for one reply (at most {MAX_UNPAGED}): "
                f"ask for pages, ?page=1&page_size={MAX_PAGE_SIZE} and on",
            )
        return [render(item) for item in items]
    try:
        page = int(query.get("page", "1"))
        size = int(query.get("page_size", str(DEFAULT_PAGE_SIZE)))
    except ValueError:
        raise Refused(400, "page and page_size must be integers") from None
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        raise Refused(400, f"page must be at least 1 and page_size 1 to {MAX_PAGE_SIZE}")
    total = len(items)
    page_count = -(-total // size)
    if page > max(page_count, 1):
        raise Refused(400, f"page out of range: there are {page_count} pages of {size}")
    chunk = items[(page - 1) * size : page * size]
    return {
        "items": [render(item) for item in chunk],
        "page": page,
        "page_size": size,
        "page_count": page_count,
        "item_count": len(chunk),
        "total_count": total,
        "filtered_count": total,
    }
