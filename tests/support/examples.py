"""How many examples a property test with its own count tries: fewer in the quick run.

The quick run (``pytest -m "not slow"``) loads Hypothesis's ``quick`` profile (tests/conftest.py);
tests that set ``max_examples`` themselves scale it by the same share, so that the run a
developer repeats stays fast while CI, running everything, tries every example.
"""

from __future__ import annotations

from typing import Final

from hypothesis import settings

# The ``dev`` profile's count, the one the explicit counts were chosen against.
FULL_EXAMPLES: Final = 100
# Fewer than this and a state machine hardly leaves its first rules.
MIN_EXAMPLES: Final = 10


def examples(full: int) -> int:
    """``full`` under the ``dev`` and ``ci`` profiles, its share under ``quick``."""
    current = settings.default
    assert current is not None  # tests/conftest.py loads a profile
    share = min(current.max_examples, FULL_EXAMPLES)
    return max(MIN_EXAMPLES, full * share // FULL_EXAMPLES)
