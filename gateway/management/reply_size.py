"""A reply's body encoded with its size counted as it grows: a listing is refused, not built,
once it passes what its connection may hold.

A listing's items are each bounded (a queue's arguments came in one request of at most
``MAX_REQUEST_SIZE``), but not their sum: 2,000 queues declared with 5 KB of arguments made
every unpaged ``GET /queues`` a reply of 10 MB. Lists and maps are encoded element by element
here, each element by :func:`encoding.encode_reply_value`, and the encoding stops at the
element that passes the limit: the server holds at most the limit and one element of it.
"""

from __future__ import annotations

from typing import Final

from sluicegate.gateway.management.encoding import encode_reply_value
from sluicegate.wire.encoding import encode_compound

# How deep the count follows lists and maps: a reply's own structure (a page's map, its list
# of items, each item's map). What lies deeper is one element's, bounded as it came in.
_DEPTH: Final = 3


class ReplyTooLarge(Exception):
    """The reply's body passed its limit; nothing of it is kept."""


def encode_within(value: object, limit: int) -> bytes:
    """``value`` encoded as :func:`encoding.encode_reply_value` encodes it, or ReplyTooLarge
    once the bytes encoded pass ``limit``."""
    return _Encoder(limit).encode(value, _DEPTH)


class _Encoder:
    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def encode(self, value: object, depth: int) -> bytes:
        if depth > 0 and type(value) is list and value:
            body = b"".join([self.encode(item, depth - 1) for item in value])
            return encode_compound(body, len(value), 0xC0, 0xD0)
        if depth > 0 and type(value) is dict and value:
            parts = []
            for key, item in value.items():
                parts.append(self.encode(key, 0))
                parts.append(self.encode(item, depth - 1))
            return encode_compound(b"".join(parts), 2 * len(value), 0xC1, 0xD1)
        encoded = encode_reply_value(value)
        self.left -= len(encoded)
        if self.left < 0:
            raise ReplyTooLarge
        return encoded
