"""JMS-style SQL-92 message selectors (``apache.org:selector-filter:string``).

The selector language of JMS 2.0 §3.8 as ActiveMQ and Qpid apply it to AMQP 1.0 messages:
comparisons, ``AND``/``OR``/``NOT``, arithmetic, ``BETWEEN``, ``IN``, ``LIKE ... ESCAPE``,
``IS [NOT] NULL``, with SQL's three-valued logic (a missing property makes a comparison
unknown, and only a true selector selects). Identifiers name application properties, or the
JMS header fields mapped onto AMQP's header and properties (``JMSMessageID``,
``JMSCorrelationID``, ``JMSPriority``, ``JMSDeliveryMode``, ``JMSTimestamp``,
``JMSExpiration``, ``JMSType``). The selector is parsed once at attach; evaluating it decodes
only the sections before the body.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Final, TypeAlias

from sluicegate.queues.filters import InvalidFilter
from sluicegate.queues.message import Message
from sluicegate.wire.codec import Value
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import APPLICATION_PROPERTIES, HEADER, PROPERTIES, sections

SELECTOR_FILTER: Final = 0x0000468C00000004
SELECTOR_NAME: Final = "apache.org:selector-filter:string"

# What an expression evaluates to: a scalar, or None for SQL's NULL/unknown.
Scalar: TypeAlias = "bool | int | float | str | None"
Fields: TypeAlias = dict[str, Value]
Expression: TypeAlias = Callable[[Fields], Scalar]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|0[xX][0-9a-fA-F]+|\d+)[lLfFdD]?
      | (?P<string>'(?:[^']|'')*')
      | (?P<name>[A-Za-z_$][A-Za-z0-9_$.]*)
      | (?P<op><>|<=|>=|[=<>()+\-*/,%])
    )""",
    re.VERBOSE,
)
_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
)
# JMS header fields, by where AMQP 1.0 carries them: (section, index in the section's list).
_JMS_FIELDS: Final = {
    "JMSMessageID": (PROPERTIES, 0),
    "JMSCorrelationID": (PROPERTIES, 5),
    "JMSType": (PROPERTIES, 3),
    "JMSTimestamp": (PROPERTIES, 9),
    "JMSExpiration": (PROPERTIES, 8),
    "JMSPriority": (HEADER, 1),
    "JMSDeliveryMode": (HEADER, 0),
}


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise InvalidFilter(f"selector: unexpected {text[pos:].strip()[:20]!r}")
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        if kind == "name" and value.upper() in _KEYWORDS:
            kind, value = "keyword", value.upper()
        tokens.append((kind, value))
        pos = match.end()
    tokens.append(("end", ""))
    return tokens


def _number(text: str) -> int | float:
    text = text.rstrip("lLfFdD") if not text.lower().startswith("0x") else text
    if text.lower().startswith("0x"):
        return int(text, 16)
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


def _is_number(value: Scalar) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _and(left: Scalar, right: Scalar) -> Scalar:
    if left is False or right is False:
        return False
    if left is True and right is True:
        return True
    return None


def _or(left: Scalar, right: Scalar) -> Scalar:
    if left is True or right is True:
        return True
    if left is False and right is False:
        return False
    return None


def _not(value: Scalar) -> Scalar:
    return None if not isinstance(value, bool) else not value


def _compare(op: str, left: Scalar, right: Scalar) -> Scalar:
    if left is None or right is None:
        return None
    if _is_number(left) and _is_number(right):
        assert isinstance(left, int | float)
        assert isinstance(right, int | float)
        return {
            "=": left == right,
            "<>": left != right,
            "<": left < right,
            ">": left > right,
            "<=": left <= right,
            ">=": left >= right,
        }[op]
    # Strings and booleans compare for (in)equality only, and only with their own type.
    if type(left) is type(right) and op in ("=", "<>"):
        return (left == right) is (op == "=")
    return None


def _arithmetic(op: str, left: Scalar, right: Scalar) -> Scalar:
    if not (_is_number(left) and _is_number(right)):
        return None
    assert isinstance(left, int | float)
    assert isinstance(right, int | float)
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        return None
    if op == "%":
        return left % right
    return left / right if isinstance(left, float) or isinstance(right, float) else left // right


def _binary(
    combine: Callable[[Scalar, Scalar], Scalar], left: Expression, right: Expression
) -> Expression:
    return lambda fields: combine(left(fields), right(fields))


def _like(pattern: str, escape: str | None) -> re.Pattern[str]:
    parts: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if escape is not None and char == escape:
            parts.append(re.escape(next(chars, "")))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


class _Parser:
    """Recursive descent over the token list, building closures over the message's fields."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self, value: str) -> bool:
        kind, text = self.tokens[self.pos]
        return kind in ("keyword", "op") and text == value

    def take(self, value: str) -> bool:
        if self.peek(value):
            self.pos += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.take(value):
            found = self.tokens[self.pos][1] or "the end"
            raise InvalidFilter(f"selector: expected {value} before {found!r}")

    def parse(self) -> Expression:
        expression = self.disjunction()
        if self.tokens[self.pos][0] != "end":
            raise InvalidFilter(f"selector: unexpected {self.tokens[self.pos][1]!r}")
        return expression

    def disjunction(self) -> Expression:
        left = self.conjunction()
        while self.take("OR"):
            right = self.conjunction()
            left = _binary(_or, left, right)
        return left

    def conjunction(self) -> Expression:
        left = self.negation()
        while self.take("AND"):
            right = self.negation()
            left = _binary(_and, left, right)
        return left

    def negation(self) -> Expression:
        if self.take("NOT"):
            inner = self.negation()
            return lambda f: _not(inner(f))
        return self.predicate()

    def predicate(self) -> Expression:
        left = self.additive()
        for op in ("=", "<>", "<=", ">=", "<", ">"):
            if self.take(op):
                right = self.additive()
                return _binary(partial(_compare, op), left, right)
        if self.take("IS"):
            negate = self.take("NOT")
            self.expect("NULL")
            return lambda f: (left(f) is None) is not negate
        negate = self.take("NOT")
        if self.take("BETWEEN"):
            low = self.additive()
            self.expect("AND")
            high = self.additive()

            def between(f: Fields) -> Scalar:
                value = left(f)
                inside = _and(_compare(">=", value, low(f)), _compare("<=", value, high(f)))
                return _not(inside) if negate else inside

            return between
        if self.take("IN"):
            self.expect("(")
            options = [self.literal()]
            while self.take(","):
                options.append(self.literal())
            self.expect(")")

            def member(f: Fields) -> Scalar:
                value = left(f)
                if not isinstance(value, str):
                    return None
                return (value in options) is not negate

            return member
        if self.take("LIKE"):
            pattern = self.literal()
            escape = self.literal() if self.take("ESCAPE") else None
            if not isinstance(pattern, str) or (escape is not None and not isinstance(escape, str)):
                raise InvalidFilter("selector: LIKE needs string patterns")
            regex = _like(pattern, escape)

            def like(f: Fields) -> Scalar:
                value = left(f)
                if not isinstance(value, str):
                    return None
                return (regex.fullmatch(value) is not None) is not negate

            return like
        if negate:
            raise InvalidFilter("selector: NOT must precede BETWEEN, IN or LIKE here")
        return left

    def additive(self) -> Expression:
        left = self.multiplicative()
        while True:
            op = next((o for o in ("+", "-") if self.take(o)), None)
            if op is None:
                return left
            right = self.multiplicative()
            left = _binary(partial(_arithmetic, op), left, right)

    def multiplicative(self) -> Expression:
        left = self.unary()
        while True:
            op = next((o for o in ("*", "/", "%") if self.take(o)), None)
            if op is None:
                return left
            right = self.unary()
            left = _binary(partial(_arithmetic, op), left, right)

    def unary(self) -> Expression:
        if self.take("-"):
            inner = self.unary()
            return lambda f: _arithmetic("-", 0, inner(f))
        if self.take("+"):
            return self.unary()
        return self.primary()

    def literal(self) -> Scalar:
        kind, text = self.tokens[self.pos]
        self.pos += 1
        if kind == "string":
            return text[1:-1].replace("''", "'")
        if kind == "number":
            return _number(text)
        if kind == "keyword" and text in ("TRUE", "FALSE"):
            return text == "TRUE"
        raise InvalidFilter(f"selector: expected a literal, found {text or 'the end'!r}")

    def primary(self) -> Expression:
        if self.take("("):
            inner = self.disjunction()
            self.expect(")")
            return inner
        kind, text = self.tokens[self.pos]
        if kind == "name":
            self.pos += 1
            return lambda f: _scalar(f.get(text))
        if kind == "keyword" and text == "NULL":
            self.pos += 1
            return lambda f: None
        value = self.literal()
        return lambda f: value


def _scalar(value: Value) -> Scalar:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return None


class Selector:
    """A compiled selector; calling it on a message says whether the message is selected."""

    __slots__ = ("_expression", "_jms", "text")

    def __init__(self, text: str) -> None:
        if not text.strip():
            raise InvalidFilter("selector: empty")
        self.text = text
        self._expression = _Parser(text).parse()
        self._jms = any(name in text for name in _JMS_FIELDS)

    def __call__(self, message: Message) -> bool:
        """True only when the selector evaluates to true (not false, not unknown)."""
        try:
            found = sections(message.payload, until=APPLICATION_PROPERTIES + 1)
        except DecodeError:
            return False
        fields: Fields = {}
        by_code: dict[int, Value] = {code: value for code, value, _, _ in found}
        application = by_code.get(APPLICATION_PROPERTIES)
        if isinstance(application, dict):
            fields.update((key, item) for key, item in application.items() if isinstance(key, str))
        if self._jms:
            for name, (code, index) in _JMS_FIELDS.items():
                section = by_code.get(code)
                present = isinstance(section, list) and index < len(section)
                value = section[index] if present else None  # type: ignore[index]
                if name == "JMSDeliveryMode":
                    value = "PERSISTENT" if value is True else "NON_PERSISTENT"
                elif name == "JMSPriority" and value is None:
                    value = 4
                fields[name] = value
        return self._expression(fields) is True
