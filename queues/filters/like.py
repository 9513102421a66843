"""SQL's ``LIKE``, matched in time linear in the subject whatever the pattern: no backtracking.

A pattern is literal characters, ``_`` (exactly one character) and ``%`` (any run of characters,
possibly none); an ``ESCAPE`` character makes the character after it literal. Translating ``%``
to ``.*`` for a backtracking regex engine lets ``'%a%a%a%a%a%a%a%a%b'`` against a long run of
``a`` take exponential time, so patterns are matched here by one of two linear methods:

- without ``_``, the pieces between ``%`` are placed greedily, leftmost first: the first is a
  prefix, the last a suffix, and each middle one is found by ``str.find`` after the one before
  it. Leftmost placement never rules out a match a later placement would allow.
- with ``_``, the pattern is a chain of states (one per character) in which ``%`` is a loop,
  simulated for all states at once in the bits of one integer (the Shift-And method): one shift,
  one ``and`` and one ``or`` per character of the subject.

Either way a match costs O(len(pattern) + len(subject)) steps of at most len(pattern) bits.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Final

from sluicegate.queues.errors import InvalidFilter

# A pattern item that matches any one character (``_``); other items are the character itself.
_ANY: Final = ""


def _items(pattern: str, escape: str | None) -> tuple[list[str], set[int]]:
    """The pattern's characters (``_ANY`` for ``_``) and where ``%`` loops: after item ``j``.

    Loop ``j`` means any run may come between item ``j`` and item ``j + 1`` (0: before the
    first, ``len(items)``: after the last).
    """
    items: list[str] = []
    loops: set[int] = set()
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            escaped = next(chars, None)
            if escaped is None:
                raise InvalidFilter("LIKE: the pattern ends with its ESCAPE character")
            items.append(escaped)
        elif char == "%":
            loops.add(len(items))
        elif char == "_":
            items.append(_ANY)
        else:
            items.append(char)
    return items, loops


class LikePattern:
    """A compiled ``LIKE`` pattern; calling it with a string says whether the string matches."""

    __slots__ = ("_any", "_exact", "_loops", "_masks", "_pieces", "_size", "text")

    def __init__(self, pattern: str, escape: str | None = None) -> None:
        if escape is not None and len(escape) != 1:
            raise InvalidFilter("LIKE: ESCAPE must be a single character")
        self.text = pattern
        items, loops = _items(pattern, escape)
        self._size = len(items)
        self._exact: str | None = None
        self._pieces: list[str] | None = None
        self._masks: dict[str, int] = {}
        self._any = 0
        self._loops = 0
        if _ANY not in items:
            if not loops:
                self._exact = "".join(items)
                return
            # The literal runs between loops: a loop at 0 or at the end leaves an empty run.
            bounds = [0, *sorted(loops), len(items)]
            self._pieces = ["".join(items[a:b]) for a, b in pairwise(bounds)]
            return
        # State j (bit j) has matched the first j items; item j + 1 moves it to state j + 1.
        for position, item in enumerate(items, start=1):
            if item == _ANY:
                self._any |= 1 << position
            else:
                self._masks[item] = self._masks.get(item, 0) | 1 << position
        for item, mask in self._masks.items():
            self._masks[item] = mask | self._any
        for position in loops:
            self._loops |= 1 << position

    def __call__(self, subject: str) -> bool:
        """True when ``subject`` matches the whole pattern."""
        if self._exact is not None:
            return subject == self._exact
        pieces = self._pieces
        if pieces is not None:
            return _placed(subject, pieces)
        return self._simulated(subject)

    def _simulated(self, subject: str) -> bool:
        if not self._loops and len(subject) != self._size:
            return False
        masks = self._masks
        default = self._any
        loops = self._loops
        states = 1
        for char in subject:
            states = ((states << 1) & masks.get(char, default)) | (states & loops)
            if not states:
                return False
        return bool(states >> self._size & 1)


def _placed(subject: str, pieces: list[str]) -> bool:
    """Match ``first % middle... % last``: prefix, suffix, then middles leftmost in between."""
    first = pieces[0]
    last = pieces[-1]
    end = len(subject) - len(last)
    if end < len(first) or not subject.startswith(first) or not subject.endswith(last):
        return False
    position = len(first)
    for piece in pieces[1:-1]:
        found = subject.find(piece, position, end)
        if found < 0:
            return False
        position = found + len(piece)
    return True
