"""The grammar JMS selectors and AMQP SQL filters share, parsed with bounded size and depth.

Each language has its own tokens (queues.filters.selector, queues.filters.sql): its literals,
identifiers and keywords. Over tokens the grammar is one, SQL-92's conditional expressions:

    expression     := conjunction ("OR" conjunction)*
    conjunction    := negation ("AND" negation)*
    negation       := "NOT" negation | predicate
    predicate      := additive [ ("=" | "<>" | "<" | ">" | "<=" | ">=") additive
                               | "IS" ["NOT"] "NULL"
                               | ["NOT"] "BETWEEN" additive "AND" additive
                               | ["NOT"] "IN" "(" additive ("," additive)* ")"
                               | ["NOT"] "LIKE" string ["ESCAPE" string] ]
    additive       := multiplicative (("+" | "-") multiplicative)*
    multiplicative := sign (("*" | "/" | "%") sign)*
    sign           := ("+" | "-") sign | primary
    primary        := "(" expression ")" | literal | field | "NULL" | "UTC" "(" ")"

Where one language allows less (JMS's ``IN`` lists of string literals only, SQL's ``IS NULL``
after a field only), the shared grammar accepts the other's wider form. Everything a client
sends is bounded before it costs more than its length: the text (:data:`MAX_LENGTH`
characters), its tokens (:data:`MAX_TOKENS`), the nesting the parser recurses through
(:data:`MAX_NESTING`) and the depth of the tree the evaluator recurses through
(:data:`MAX_DEPTH`). Breaking a limit is an :class:`~queues.errors.InvalidFilter`, which refuses
the consumer's link, never anything more.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final, NoReturn, TypeAlias

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.expression import (
    Binary,
    Field,
    In,
    Like,
    Literal,
    Logical,
    Node,
    Scalar,
    Unary,
    Utc,
    children,
)
from sluicegate.queues.filters.like import LikePattern

# The limits of AMQP SQL filters in RabbitMQ 4.2 (after the OASIS filter expressions' advice to
# limit complexity, §7.1) are 4,096 characters and 200 tokens; JMS selectors get the same
# length, and room for an IN list of a couple of hundred values.
MAX_LENGTH: Final = 4096
MAX_TOKENS: Final = 512
# Parentheses, NOTs and signs nested: the parser recurses through eight functions per level,
# so 32 levels stay far below the interpreter's recursion limit (1,000 frames).
MAX_NESTING: Final = 32
# Nodes from the root to the deepest leaf: the evaluator's closures recurse through them.
MAX_DEPTH: Final = 64

# A token: its kind (literal, field, keyword, op, end) and its value.
Token: TypeAlias = "tuple[str, Scalar | Field]"
END: Final[Token] = ("end", None)
_COMPARISONS: Final = ("=", "<>", "<=", ">=", "<", ">")


def checked_length(language: str, text: str) -> str:
    """The expression's text, refused if longer than :data:`MAX_LENGTH`."""
    if len(text) > MAX_LENGTH:
        raise InvalidFilter(f"{language}: longer than {MAX_LENGTH} characters")
    if not text.strip():
        raise InvalidFilter(f"{language}: empty")
    return text


def lexemes(language: str, pattern: re.Pattern[str], text: str) -> Iterator[tuple[str, str]]:
    """Each lexeme of ``text`` as (the name of the group of ``pattern`` it matched, its text);
    text that no group matches is refused, naming where it starts."""
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = pattern.match(text, pos)
        if match is None or match.end() == pos:
            raise InvalidFilter(f"{language}: unexpected {text[pos:].strip()[:20]!r}")
        pos = match.end()
        kind = match.lastgroup or ""
        yield kind, match.group(kind)


def checked_tokens(language: str, tokens: list[Token]) -> list[Token]:
    """The token list, refused above :data:`MAX_TOKENS` tokens; the end token is added."""
    if len(tokens) > MAX_TOKENS:
        raise InvalidFilter(f"{language}: more than {MAX_TOKENS} tokens")
    return [*tokens, END]


def depth(node: Node) -> int:
    """Nodes on the longest path from ``node`` down, found without recursion."""
    deepest = 0
    pending = [(node, 1)]
    while pending:
        current, level = pending.pop()
        deepest = max(deepest, level)
        pending.extend((child, level + 1) for child in children(current))
    return deepest


class Parser:
    """Recursive descent over one language's tokens; ``division`` is its ``/`` node's op."""

    def __init__(self, language: str, tokens: list[Token], division: str) -> None:
        self.language = language
        self.tokens = tokens
        self.pos = 0
        self.division = division
        self.nesting = 0

    def parse(self) -> Node:
        """The whole token list as one expression, within the limits."""
        node = self.expression()
        if self.tokens[self.pos] != END:
            self.fail(f"unexpected {self.describe()}")
        if depth(node) > MAX_DEPTH:
            self.fail(f"nested deeper than {MAX_DEPTH}")
        return node

    # -- tokens --------------------------------------------------------------------------

    def fail(self, reason: str) -> NoReturn:
        raise InvalidFilter(f"{self.language}: {reason}")

    def describe(self) -> str:
        kind, value = self.tokens[self.pos]
        return "the end" if kind == "end" else repr(value)

    def take(self, symbol: str) -> bool:
        kind, value = self.tokens[self.pos]
        if kind in ("keyword", "op") and value == symbol:
            self.pos += 1
            return True
        return False

    def expect(self, symbol: str) -> None:
        if not self.take(symbol):
            self.fail(f"expected {symbol} before {self.describe()}")

    def nest(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            self.fail(f"nested deeper than {MAX_NESTING}")

    # -- grammar -------------------------------------------------------------------------

    def expression(self) -> Node:
        operands = [self.conjunction()]
        while self.take("OR"):
            operands.append(self.conjunction())
        return operands[0] if len(operands) == 1 else Logical("OR", tuple(operands))

    def conjunction(self) -> Node:
        operands = [self.negation()]
        while self.take("AND"):
            operands.append(self.negation())
        return operands[0] if len(operands) == 1 else Logical("AND", tuple(operands))

    def negation(self) -> Node:
        if not self.take("NOT"):
            return self.predicate()
        self.nest()
        operand = self.negation()
        self.nesting -= 1
        return Unary("NOT", operand)

    def predicate(self) -> Node:
        left = self.additive()
        for op in _COMPARISONS:
            if self.take(op):
                return Binary(op, left, self.additive())
        if self.take("IS"):
            negated = self.take("NOT")
            self.expect("NULL")
            return self.negated(negated, Unary("null", left))
        negated = self.take("NOT")
        if self.take("BETWEEN"):
            low = self.additive()
            self.expect("AND")
            high = self.additive()
            inside = Logical("AND", (Binary(">=", left, low), Binary("<=", left, high)))
            return self.negated(negated, inside)
        if self.take("IN"):
            self.expect("(")
            options = [self.additive()]
            while self.take(","):
                options.append(self.additive())
            self.expect(")")
            return self.negated(negated, In(left, tuple(options)))
        if self.take("LIKE"):
            pattern = self.string("LIKE needs a string pattern")
            escape = self.string("ESCAPE needs a string") if self.take("ESCAPE") else None
            return self.negated(negated, Like(left, LikePattern(pattern, escape)))
        if negated:
            self.fail("NOT must precede BETWEEN, IN or LIKE here")
        return left

    @staticmethod
    def negated(negated: bool, node: Node) -> Node:
        return Unary("NOT", node) if negated else node

    def string(self, reason: str) -> str:
        kind, value = self.tokens[self.pos]
        if kind != "literal" or not isinstance(value, str):
            self.fail(f"{reason}, found {self.describe()}")
        self.pos += 1
        return value

    def additive(self) -> Node:
        left = self.multiplicative()
        while True:
            op = "+" if self.take("+") else "-" if self.take("-") else None
            if op is None:
                return left
            left = Binary(op, left, self.multiplicative())

    def multiplicative(self) -> Node:
        left = self.sign()
        while True:
            if self.take("*"):
                op = "*"
            elif self.take("/"):
                op = self.division
            elif self.take("%"):
                op = "%"
            else:
                return left
            left = Binary(op, left, self.sign())

    def sign(self) -> Node:
        op = "neg" if self.take("-") else "pos" if self.take("+") else None
        if op is None:
            return self.primary()
        self.nest()
        operand = self.sign()
        self.nesting -= 1
        return Unary(op, operand)

    def primary(self) -> Node:
        if self.take("("):
            self.nest()
            inner = self.expression()
            self.nesting -= 1
            self.expect(")")
            return inner
        if self.take("NULL"):
            return Literal(None)
        if self.take("UTC"):
            self.expect("(")
            self.expect(")")
            return Utc()
        kind, value = self.tokens[self.pos]
        if kind == "literal":
            self.pos += 1
            assert not isinstance(value, Field)
            return Literal(value)
        if kind == "field":
            self.pos += 1
            assert isinstance(value, Field)
            return value
        self.fail(f"expected a value, found {self.describe()}")
