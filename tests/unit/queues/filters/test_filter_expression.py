"""The shared evaluator against a reference: random expressions, written as JMS selectors and as
SQL filters, evaluated on random application properties with SQL's three-valued logic."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.filters.selector import parse_selector
from sluicegate.queues.filters.sql import parse_sql
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.wire.amqp_types import Described, Value
from sluicegate.wire.encoding import encode

Known = bool | int | float | str | None


@dataclass(frozen=True)
class Expr:
    """A tiny expression tree the test writes out in both languages and evaluates itself."""

    op: str
    args: tuple[Expr | Known, ...]


_KEYS = ("a", "b", "c")
_STRINGS = st.text(alphabet="xy'%_", max_size=3)
_VALUES: st.SearchStrategy[Known] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([0.5, -1.5, 2.0]),
    _STRINGS,
)


def _literal(value: Known) -> str:
    if value is True:
        return "TRUE"
    if value is False:
        return "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _write(node: Expr | Known) -> str:
    if not isinstance(node, Expr):
        return _literal(node)
    op, args = node.op, node.args
    if op == "field":
        return str(args[0])
    if op in ("AND", "OR"):
        return "(" + f" {op} ".join(_write(a) for a in args) + ")"
    if op == "NOT":
        return f"(NOT {_write(args[0])})"
    if op == "null":
        return f"({_write(args[0])} IS NULL)"
    if op == "IN":
        options = ", ".join(_write(a) for a in args[1:])
        return f"({_write(args[0])} IN ({options}))"
    if op == "LIKE":
        return f"({_write(args[0])} LIKE {_write(args[1])})"
    return f"({_write(args[0])} {op} {_write(args[1])})"


_FIELDS = st.sampled_from(_KEYS).map(lambda k: Expr("field", (k,)))
_OPERANDS = st.one_of(_FIELDS, _VALUES.filter(lambda v: v is not None))
_ARITHMETIC = st.builds(
    lambda op, a, b: Expr(op, (a, b)), st.sampled_from("+-*"), _OPERANDS, _OPERANDS
)
_VALUE_EXPRS = st.one_of(_OPERANDS, _ARITHMETIC)
_PREDICATES = st.one_of(
    st.builds(
        lambda op, a, b: Expr(op, (a, b)),
        st.sampled_from(["=", "<>", "<", ">", "<=", ">="]),
        _VALUE_EXPRS,
        _VALUE_EXPRS,
    ),
    st.builds(lambda a: Expr("null", (a,)), _FIELDS),
    st.builds(
        lambda a, options: Expr("IN", (a, *options)),
        _FIELDS,
        st.lists(_STRINGS | st.integers(-2, 2), min_size=1, max_size=3),
    ),
    st.builds(lambda a, p: Expr("LIKE", (a, p)), _FIELDS, _STRINGS),
    _FIELDS,
)
_CONDITIONS = st.recursive(
    _PREDICATES,
    lambda inner: st.one_of(
        st.builds(lambda a: Expr("NOT", (a,)), inner),
        st.builds(
            lambda op, xs: Expr(op, tuple(xs)),
            st.sampled_from(["AND", "OR"]),
            st.lists(inner, min_size=2, max_size=3),
        ),
    ),
    max_leaves=8,
)


def _number(value: Known) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _like(pattern: str, subject: str) -> bool:
    """Reference LIKE by dynamic programming over (pattern, subject) prefixes."""
    matched = [True] + [False] * len(subject)
    for char in pattern:
        if char == "%":
            matched = [any(matched[: i + 1]) for i in range(len(subject) + 1)]
        else:
            matched = [False] + [
                matched[i] and (char == "_" or char == subject[i]) for i in range(len(subject))
            ]
    return matched[-1]


def _eval(node: Expr | Known, fields: dict[str, Known]) -> Known:
    if not isinstance(node, Expr):
        return node
    op, args = node.op, node.args
    if op == "field":
        return fields.get(str(args[0]))
    values = [_eval(a, fields) for a in args]
    # A value that is not a boolean (a number, say) is unknown to AND, OR and NOT.
    if op == "AND":
        if any(v is False for v in values):
            return False
        return True if all(v is True for v in values) else None
    if op == "OR":
        if any(v is True for v in values):
            return True
        return False if all(v is False for v in values) else None
    if op == "NOT":
        return None if not isinstance(values[0], bool) else not values[0]
    if op == "null":
        return values[0] is None
    left = values[0]
    if op == "IN":
        return None if left is None else any(_same(left, o) for o in values[1:])
    if op == "LIKE":
        return _like(str(values[1]), left) if isinstance(left, str) else None
    right = values[1]
    if op in "+-*":
        if not (isinstance(left, int | float) and isinstance(right, int | float)):
            return None
        if isinstance(left, bool) or isinstance(right, bool):
            return None
        return left + right if op == "+" else left - right if op == "-" else left * right
    if left is None or right is None:
        return None
    if op == "=":
        return _same(left, right)
    if op == "<>":
        return not _same(left, right)
    if not (
        (_number(left) and _number(right)) or (isinstance(left, str) and isinstance(right, str))
    ):
        return False
    ordered = {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}  # type: ignore[operator]
    return ordered[op]


def _same(left: Known, right: Known) -> bool:
    if _number(left) or _number(right):
        return _number(left) and _number(right) and left == right
    return type(left) is type(right) and left == right


def _message(fields: dict[str, Known]) -> Message:
    application: dict[Value, Value] = dict(fields.items())
    return Message(b"\x00\x53\x74" + encode(application) + encode(Described(0x77, "body")))


@given(
    condition=_CONDITIONS,
    fields=st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=3),
)
def test_both_languages_evaluate_as_the_reference(
    condition: Expr, fields: dict[str, Known]
) -> None:
    text = _write(condition)
    expected = _eval(condition, fields) is True
    views = ViewCache()
    message = _message(fields)
    assert parse_selector(text, views, Clock())(message) is expected, text
    assert parse_sql(text, views, Clock())(message) is expected, text
    # One decode (none without fields) served both languages.
    assert views.statistics().decodes <= 1
