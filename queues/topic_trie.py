"""A topic exchange's binding keys as a trie of words, matched once per routing key.

Matching each binding key in turn costs (bindings x words) per routing key: a thousand bindings
and a message naming hundreds of ``x-cc`` keys made one publish seconds of the reactor. Here a
routing key walks the trie once, as RabbitMQ's topic exchange does: a word follows its own edge
and the ``*`` edge; a ``#`` node matches zero words by being walked through and one more word by
staying put. Each state (node, words consumed) is visited once, so a match costs at most
(trie nodes x (words + 1)) steps whatever the patterns, and in practice the few paths that match.
Each binding key is found at most once. Bindings made to be slow (chains of ``*`` after a ``#``,
met by a routing key of thousands of words) could still make one match visit millions of
states: past :data:`MAX_STATES` the match stops and the message is refused
(``amqp:resource-limit-exceeded``) instead of holding the reactor.
"""

from __future__ import annotations

from typing import Final

from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.route_steps import Take

_HASH: Final = "#"
_STAR: Final = "*"
# States one match may take up (once visited, again when reached another way): 1-7 us each
# (measured on a loaded machine), so some 5-35 ms of the reactor; a routing key of 20 words
# takes up a few hundred in 20,000 bindings of ``#.WORD.#`` and ``WORD.*.#``.
MAX_STATES: Final = 5_000


class _Node:
    """The binding keys sharing a prefix of words."""

    __slots__ = ("children", "hash", "key", "uses")

    def __init__(self, hash_node: bool) -> None:
        self.children: dict[str, _Node] = {}
        # The binding key whose words end here, if one does.
        self.key: str | None = None
        # Binding keys through this node: it goes when the last of them does.
        self.uses = 0
        # A ``#`` word: it may swallow any number of the routing key's words.
        self.hash = hash_node


class TopicTrie:
    """The distinct binding keys of one topic exchange's routes."""

    __slots__ = ("_hashes", "_root")

    def __init__(self) -> None:
        self._root = _Node(False)
        # ``#`` nodes in the trie: without any, no state is reached twice and none is recorded.
        self._hashes = 0

    def add(self, binding_key: str) -> None:
        """Add a binding key not in the trie."""
        node = self._root
        for word in binding_key.split("."):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == _HASH)
                self._hashes += child.hash
            child.uses += 1
            node = child
        node.key = binding_key

    def remove(self, binding_key: str) -> None:
        """Remove a binding key the trie has, and the nodes only it used."""
        node = self._root
        for word in binding_key.split("."):
            child = node.children[word]
            child.uses -= 1
            if not child.uses:
                del node.children[word]
                self._hashes -= _hashes_under(child)
                return
            node = child
        node.key = None

    def match(self, routing_key: str, take: Take | None = None) -> list[str]:
        """The binding keys that match ``routing_key``, each once; the states visited are
        taken from what routing the message may still do (``take``), if given."""
        words = routing_key.split(".")
        end = len(words)
        found: list[str] = []
        seen: set[tuple[_Node, int]] | None = set() if self._hashes else None
        pending = [(self._root, 0)]
        steps = popped = 0
        while pending:
            state = pending.pop()
            popped += 1
            if seen is not None:
                steps += 1
                if steps > MAX_STATES:
                    raise ResourceLimitExceeded(
                        f"routing key of {end} words: topic matching would visit more than "
                        f"{MAX_STATES} states of the exchange's bindings"
                    )
                if state in seen:
                    continue
                seen.add(state)
            node, at = state
            children = node.children
            if children:
                hashed = children.get(_HASH)
                if hashed is not None:
                    pending.append((hashed, at))
            if at == end:
                if node.key is not None:
                    found.append(node.key)
                continue
            if node.hash:
                pending.append((node, at + 1))
            if children:
                star = children.get(_STAR)
                if star is not None:
                    pending.append((star, at + 1))
                word = children.get(words[at])
                if word is not None and word is not star and not word.hash:
                    pending.append((word, at + 1))
        if take is not None:
            take(popped)
        return found


def _hashes_under(node: _Node) -> int:
    """The ``#`` nodes of a subtree being dropped (it holds one binding key's rest: a chain)."""
    count = 0
    while True:
        count += node.hash
        if not node.children:
            return count
        node = next(iter(node.children.values()))
