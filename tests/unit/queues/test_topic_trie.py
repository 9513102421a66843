"""The topic trie matches exactly the binding keys the word-by-word matcher matches, each once,
and its work per routing key does not grow with the number of bindings that cannot match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.topic_trie import TopicTrie


def topic_matches(binding_key: str, routing_key: str) -> bool:
    """The oracle: AMQP 0-9-1 topic matching of one binding key, word by word, backtracking
    to the last ``#`` (what topic exchanges did per binding before the trie)."""
    pattern, words = binding_key.split("."), routing_key.split(".")
    p = w = 0
    star_p, star_w = -1, 0
    while w < len(words):
        if p < len(pattern) and pattern[p] == "#":
            star_p, star_w = p, w
            p += 1
        elif p < len(pattern) and pattern[p] in ("*", words[w]):
            p += 1
            w += 1
        elif star_p >= 0:
            star_w += 1
            p, w = star_p + 1, star_w
        else:
            return False
    while p < len(pattern) and pattern[p] == "#":
        p += 1
    return p == len(pattern)


# Few distinct words, so that patterns and keys meet often.
_WORDS = st.sampled_from(["a", "b", "c", "", "*", "#"])
_KEYS = st.lists(_WORDS, min_size=1, max_size=6).map(".".join)


@settings(max_examples=examples(300))
@given(st.lists(_KEYS, max_size=12, unique=True), st.lists(_KEYS, max_size=6), _KEYS)
def test_the_trie_matches_what_topic_matching_matches(
    bound: list[str], removed: list[str], routing_key: str
) -> None:
    trie = TopicTrie()
    for key in bound:
        trie.add(key)
    kept = list(bound)
    for key in removed:
        if key in kept:
            trie.remove(key)
            kept.remove(key)
    found = trie.match(routing_key)
    assert len(found) == len(set(found))
    assert sorted(found) == sorted(k for k in kept if topic_matches(k, routing_key))


def test_removing_every_key_leaves_an_empty_trie() -> None:
    trie = TopicTrie()
    keys = ["a.#", "a.#.b", "#", "a.b", "a", "*.#.*"]
    for key in keys:
        trie.add(key)
    for key in keys:
        trie.remove(key)
    assert trie.match("a.b") == []
    trie.add("a.b")
    assert trie.match("a.b") == ["a.b"]


def test_many_hash_patterns_visit_each_state_once() -> None:
    """Chains of ``#`` against a long key of one word: without visiting each (node, word) once,
    the walk would branch at every ``#`` for every word: C(60, 10) paths, never finished.
    Visited once each, the 20 nodes at 61 positions stay within the bound."""
    trie = TopicTrie()
    for depth in range(1, 11):
        trie.add(".".join(["#"] * depth + ["b"]))
    routing_key = ".".join(["a"] * 60)
    assert trie.match(routing_key) == []
    assert len(trie.match(routing_key + ".b")) == 10


def test_a_match_past_its_states_is_refused_not_run() -> None:
    """Bindings made to be slow: a ``#`` then 100 ``*`` against a routing key of 5,000 words
    would visit millions of states (seconds); the match is refused past MAX_STATES."""
    trie = TopicTrie()
    for n in range(50):
        trie.add(".".join(["#", *["*"] * 100, f"z{n}"]))
    with pytest.raises(ResourceLimitExceeded, match="topic matching"):
        trie.match(".".join(["a"] * 5000))
    # Ordinary keys still match beside them: the bound is far above what they take up.
    trie.add("orders.*")
    assert trie.match("orders.eu") == ["orders.*"]
    assert trie.match(".".join(["a"] * 20 + ["z7"])) == []


def test_ordinary_bindings_stay_far_below_the_bound() -> None:
    trie = TopicTrie()
    for n in range(10_000):
        trie.add(f"#.w{n}.#")
        trie.add(f"w{n}.*.#")
    words = [f"w{n}" for n in range(0, 10_000, 500)]
    assert len(trie.match(".".join(words))) == 21
