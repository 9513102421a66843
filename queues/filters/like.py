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

Either way a match costs O(len(pattern) + len(subject)) steps of at most len(pattern) bits,
and :meth:`LikePattern.cost` says how much, in the units of a filter's read budget
(queues.filters.budget): a 4,000-item pattern with ``_`` over a 60,000-character string takes
some 50 ms, and a flat charge per evaluation let a few such consumers hold the reactor seconds.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Final

from sluicegate.queues.errors import InvalidFilter

# A pattern item that matches any one character (``_``); other items are the character itself.
_ANY: Final = ""
# Cost of the Shift-And simulation, per character of the subject: about 0.25 us plus 0.17 us per
# 1,000 items of state (measured on CPython 3.11 from 1 to 4,000 items), and a budget unit is
# some 2 us (queues.filters.budget): a unit per SIMULATED_CHARS_PER_UNIT characters for every
# ITEMS_PER_STEP items or part of them, rounded up.
SIMULATED_CHARS_PER_UNIT: Final = 8
ITEMS_PER_STEP: Final = 1000
# str.find, startswith and == run in C: a unit per SCANNED_CHARS_PER_UNIT characters scanned,
# the pattern's pieces included (two-way search stays linear for long pieces).
SCANNED_CHARS_PER_UNIT: Final = 256


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

    __slots__ = ("_any", "_exact", "_loops", "_masks", "_per_char", "_pieces", "_size", "text")

    def __init__(self, pattern: str, escape: str | None = None) -> None:
        if escape is not None and len(escape) != 1:
            raise InvalidFilter("LIKE: ESCAPE must be a single character")
        self.text = pattern
        items, loops = _items(pattern, escape)
        self._size = len(items)
        # Simulation steps per subject character, for cost(); 0 when no simulation runs.
        self._per_char = 0
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
        self._per_char = 1 + len(items) // ITEMS_PER_STEP

    def __call__(self, subject: str) -> bool:
        """True when ``subject`` matches the whole pattern."""
        if self._exact is not None:
            return subject == self._exact
        pieces = self._pieces
        if pieces is not None:
            return pieces_in_order(subject, pieces)
        return self._simulated(subject)

    def cost(self, subject: str) -> int:
        """Budget units a match against ``subject`` costs, at least 1 (charged whatever the
        result: a simulation may stop early, never later)."""
        if self._per_char:
            return 1 + len(subject) * self._per_char // SIMULATED_CHARS_PER_UNIT
        return 1 + (len(subject) + self._size) // SCANNED_CHARS_PER_UNIT

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


def pieces_in_order(subject: str, pieces: list[str]) -> bool:
    """Match ``first % middle... % last``: prefix, suffix, then middles leftmost in between.

    Any wildcard of one kind, split on it, is matched so (an OAuth 2 scope's ``*`` too,
    gateway/oauth2.py), with no expression compiled."""
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
