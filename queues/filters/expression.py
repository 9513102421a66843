"""The one evaluator of filter expressions: JMS selectors and AMQP SQL filters alike.

Both languages are SQL-92 conditional expressions with SQL's three-valued logic: a missing
field is NULL, comparison or arithmetic with NULL is unknown (``None`` here), ``NOT`` unknown
is unknown, and only an expression that evaluates to true selects a message. Where the two
agree (JMS 2.0 §3.8.1 and the OASIS AMQP Filter Expressions §6, as RabbitMQ 4.2 applies them),
they share these nodes and their semantics:

- values compare only with values of their kind: numbers (integers and floats together),
  strings (ordered by code point), binaries (ordered by byte), booleans (equality only); a
  comparison of different kinds is false, and ``<>`` is the negation of ``=``;
- ``+ - * /`` on numbers, ``%`` on integers (remainder with the dividend's sign); a division by
  zero is unknown. Dividing two integers is where they differ: JMS truncates (Java), SQL filters
  divide exactly (RabbitMQ), so each parser picks its division node;
- ``IN`` is true when some option equals the value, ``LIKE`` matches strings only
  (queues.filters.like), ``IS NULL`` tests for a missing field.

A parser builds a tree of :class:`Node`; :func:`compile_node` turns it into nested closures over
a message's :class:`~queues.filters.view.FilterView`. Evaluation costs one call per node, plus
the comparisons of the values it reads: O(size of the expression x size of the fields it reads).
Each evaluation adds that cost to its :class:`~queues.filters.view.ViewCache`'s ``work``, in
the units of the read budget (queues.filters.budget): a unit per :data:`NODES_PER_UNIT` nodes,
per :data:`COMPARED_CHARS_PER_UNIT` characters or bytes compared, and what a LIKE's match costs
(:meth:`~queues.filters.like.LikePattern.cost`), so the budget measures what was really done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final, TypeAlias

from sluicegate.queues.filters.like import LikePattern
from sluicegate.queues.filters.view import (
    APPLICATION_PART,
    HEADER_PART,
    PROPERTIES_PART,
    FilterView,
    ViewCache,
)
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.wire.amqp_types import Value

# A node's call is some 0.1-0.2 us and a budget unit some 2 us (queues.filters.budget).
NODES_PER_UNIT: Final = 16
# Comparing strings or binaries runs in C (memcmp): a unit per this many characters or bytes,
# so two 60,000-character strings compared cost some 120 units.
COMPARED_CHARS_PER_UNIT: Final = 1024

# What an expression evaluates to; None is SQL's NULL or unknown.
Scalar: TypeAlias = "bool | int | float | str | bytes | None"
Expression: TypeAlias = Callable[[FilterView], Scalar]


class Section(Enum):
    """Where a field's value comes from."""

    APPLICATION = "application"  # an application property, by key
    PROPERTY = "property"  # a field of the properties section, by index (AMQP 1.0 §3.2.4)
    PRIORITY = "priority"  # the header's priority, 4 when absent
    DELIVERY_MODE = "delivery-mode"  # JMS: PERSISTENT or NON_PERSISTENT, from header.durable


_PARTS: Final = {
    Section.APPLICATION: APPLICATION_PART,
    Section.PROPERTY: PROPERTIES_PART,
    Section.PRIORITY: HEADER_PART,
    Section.DELIVERY_MODE: HEADER_PART,
}


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant."""

    value: Scalar


@dataclass(frozen=True, slots=True)
class Field:
    """A field of the message: an application property's key or a property's index."""

    section: Section
    key: str | int = 0


@dataclass(frozen=True, slots=True)
class Utc:
    """``UTC()``: the current time in milliseconds since the epoch (the queues' clock)."""


@dataclass(frozen=True, slots=True)
class Unary:
    """``NOT``, ``-`` (``neg``), ``+`` (``pos``) or ``IS NULL`` (``null``) of an operand."""

    op: str
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    """A comparison (``= <> < > <= >=``) or arithmetic (``+ - * / div %``) of two operands.

    ``/`` divides exactly; ``div`` truncates when both operands are integers.
    """

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Logical:
    """``AND`` or ``OR`` of two or more operands, flattened so chains do not nest."""

    op: str
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class In:
    """``value IN (option, ...)``."""

    value: Node
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Like:
    """``value LIKE pattern [ESCAPE char]``."""

    value: Node
    pattern: LikePattern


Node: TypeAlias = "Literal | Field | Utc | Unary | Binary | Logical | In | Like"


def children(node: Node) -> tuple[Node, ...]:
    """The operands of a node."""
    if isinstance(node, Unary):
        return (node.operand,)
    if isinstance(node, Binary):
        return (node.left, node.right)
    if isinstance(node, Logical):
        return node.operands
    if isinstance(node, In):
        return (node.value, *node.options)
    if isinstance(node, Like):
        return (node.value,)
    return ()


def node_count(node: Node) -> int:
    """The nodes of an expression: each evaluation calls each at most once."""
    count = 0
    pending = [node]
    while pending:
        count += 1
        pending.extend(children(pending.pop()))
    return count


def parts_read(node: Node) -> int:
    """The message parts (queues.filters.view) an expression reads: only those are decoded."""
    parts = 0
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, Field):
            parts |= _PARTS[current.section]
        pending.extend(children(current))
    return parts


# -- values ----------------------------------------------------------------------------------


def is_number(value: object) -> bool:
    """True for integers and floats; a boolean is not a number in SQL."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def scalar(value: Value) -> Scalar:
    """A field's value as an expression sees it: compound and described values are NULL."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    return None


def equal(left: Scalar, right: Scalar) -> bool:
    """SQL equality of two values: same kind and equal (an integer may equal a float)."""
    if is_number(left) or is_number(right):
        return is_number(left) and is_number(right) and left == right
    if isinstance(left, str) and isinstance(right, str):
        # A symbol is a string here, as RabbitMQ compares them.
        return left == right
    return type(left) is type(right) and left == right


def compare(op: str, left: Scalar, right: Scalar) -> Scalar:
    """A comparison: unknown with NULL, false across kinds, ordering for numbers and text."""
    if left is None or right is None:
        return None
    if op == "=":
        return equal(left, right)
    if op == "<>":
        return not equal(left, right)
    comparable = (
        (is_number(left) and is_number(right))
        or (isinstance(left, str) and isinstance(right, str))
        or (isinstance(left, bytes) and isinstance(right, bytes))
    )
    if not comparable:
        return False
    if op == "<":
        return left < right  # type: ignore[operator]
    if op == ">":
        return left > right  # type: ignore[operator]
    if op == "<=":
        return left <= right  # type: ignore[operator]
    return left >= right  # type: ignore[operator]


def _truncated(left: int, right: int) -> tuple[int, int]:
    """Java's and Erlang's integer division: quotient toward zero, remainder of the dividend's
    sign (Python's ``//`` and ``%`` floor instead)."""
    quotient = abs(left) // abs(right)
    if (left < 0) != (right < 0):
        quotient = -quotient
    return quotient, left - quotient * right


def arithmetic(op: str, left: Scalar, right: Scalar) -> Scalar:
    """Arithmetic on numbers; anything else, or a division by zero, is unknown."""
    if not (is_number(left) and is_number(right)):
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
    if op == "/":
        return left / right
    both_integers = isinstance(left, int) and isinstance(right, int)
    if op == "div":
        if both_integers:
            return _truncated(left, right)[0]  # type: ignore[arg-type]
        return left / right
    if not both_integers:
        return None
    return _truncated(left, right)[1]  # type: ignore[arg-type]


# -- compiling ---------------------------------------------------------------------------------


def _field(field: Field) -> Expression:
    key = field.key
    if field.section is Section.APPLICATION:
        return lambda view: scalar(view.application.get(key))  # type: ignore[arg-type]
    if field.section is Section.PROPERTY:
        assert isinstance(key, int)

        def property_value(view: FilterView) -> Scalar:
            properties = view.properties
            return scalar(properties[key]) if key < len(properties) else None

        return property_value
    if field.section is Section.PRIORITY:
        return lambda view: view.priority
    return lambda view: "PERSISTENT" if view.durable else "NON_PERSISTENT"


def _logical(op: str, operands: list[Expression]) -> Expression:
    decisive = op == "OR"

    def logical(view: FilterView) -> Scalar:
        unknown = False
        for operand in operands:
            value = operand(view)
            if value is decisive:
                return decisive
            if value is not (not decisive):
                unknown = True
        return None if unknown else not decisive

    return logical


def _unary(op: str, operand: Expression) -> Expression:
    if op == "NOT":

        def negation(view: FilterView) -> Scalar:
            value = operand(view)
            return not value if isinstance(value, bool) else None

        return negation
    if op == "null":
        return lambda view: operand(view) is None

    def sign(view: FilterView) -> Scalar:
        value = operand(view)
        if not is_number(value):
            return None
        return -value if op == "neg" else value  # type: ignore[operator]

    return sign


def _compared(left: Scalar, right: Scalar) -> int:
    """Units of comparing two values: strings and binaries by their length, the rest free."""
    size = 0
    if isinstance(left, str | bytes):
        size += len(left)
    if isinstance(right, str | bytes):
        size += len(right)
    return size // COMPARED_CHARS_PER_UNIT


def compile_node(node: Node, clock: Clock, views: ViewCache) -> Expression:
    """The node as a function of a message's view; what it costs beyond its nodes is added to
    ``views.work``."""
    if isinstance(node, Literal):
        value = node.value
        return lambda view: value
    if isinstance(node, Field):
        return _field(node)
    if isinstance(node, Utc):
        return lambda view: clock.now
    if isinstance(node, Logical):
        return _logical(node.op, [compile_node(n, clock, views) for n in node.operands])
    if isinstance(node, Unary):
        return _unary(node.op, compile_node(node.operand, clock, views))
    if isinstance(node, Binary):
        op = node.op
        left = compile_node(node.left, clock, views)
        right = compile_node(node.right, clock, views)
        if op not in ("=", "<>", "<", ">", "<=", ">="):
            return lambda view: arithmetic(op, left(view), right(view))

        def comparison(view: FilterView) -> Scalar:
            a, b = left(view), right(view)
            views.work += _compared(a, b)
            return compare(op, a, b)

        return comparison
    if isinstance(node, In):
        subject = compile_node(node.value, clock, views)
        options = [compile_node(n, clock, views) for n in node.options]

        def member(view: FilterView) -> Scalar:
            value = subject(view)
            if value is None:
                return None
            for option in options:
                other = option(view)
                views.work += _compared(value, other)
                if equal(value, other):
                    return True
            return False

        return member
    subject = compile_node(node.value, clock, views)
    pattern = node.pattern

    def like(view: FilterView) -> Scalar:
        value = subject(view)
        if not isinstance(value, str):
            return None
        views.work += pattern.cost(value)
        return pattern(value)

    return like


class ExpressionFilter:
    """A parsed expression applied to messages: selected only when it evaluates to true.

    Only the parts of a message the expression reads are decoded, once per message, through
    the server's :class:`~queues.filters.view.ViewCache`.
    """

    __slots__ = ("_expression", "_nodes_cost", "_parts", "_views", "text")

    def __init__(self, text: str, node: Node, views: ViewCache, clock: Clock) -> None:
        self.text = text
        self._expression = compile_node(node, clock, views)
        self._parts = parts_read(node)
        self._nodes_cost = node_count(node) // NODES_PER_UNIT
        self._views = views

    def __call__(self, message: Message) -> bool:
        """True only when the expression is true for the message (not false, not unknown)."""
        views = self._views
        view = views.view(message, self._parts)
        if view.malformed:
            return False
        views.work += self._nodes_cost
        return self._expression(view) is True
