"""JMS message selectors (``apache.org:selector-filter:string``), as ActiveMQ and Qpid read them.

The selector language of JMS 2.0 §3.8: case-insensitive keywords, Java's identifiers and
numeric literals (decimal, hex, with an ``L``/``F``/``D`` suffix or none), single-quoted
strings, ``BETWEEN``, and integer division that truncates as Java's does. Identifiers name
application properties, or the JMS header fields mapped onto AMQP's header and properties
(``JMSMessageID``, ``JMSCorrelationID``, ``JMSPriority``, ``JMSDeliveryMode``, ``JMSTimestamp``,
``JMSExpiration``, ``JMSType``). Grammar and evaluation are shared with the AMQP SQL filter
(queues.filters.parser, queues.filters.expression); this module owns the tokens.
"""

from __future__ import annotations

import re
from typing import Final

from sluicegate.queues.filters.expression import ExpressionFilter, Field, Section
from sluicegate.queues.filters.parser import (
    Parser,
    Token,
    checked_length,
    checked_tokens,
    lexemes,
)
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.queue_type import Clock

SELECTOR_FILTER: Final = 0x0000468C00000004
SELECTOR_NAME: Final = "apache.org:selector-filter:string"
_LANGUAGE: Final = "selector"

_TOKEN: Final = re.compile(
    r"""\s*(?:
        (?P<number>(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+
                    |0[xX][0-9a-fA-F]+|\d+)[lLfFdD]?)
      | (?P<string>'(?:[^']|'')*')
      | (?P<name>[A-Za-z_$][A-Za-z0-9_$.]*)
      | (?P<op><>|<=|>=|[=<>()+\-*/,%])
    )""",
    re.VERBOSE,
)
_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
)
# JMS header fields, by where AMQP 1.0 carries them (indexes in the properties list, §3.2.4).
_JMS_FIELDS: Final = {
    "JMSMessageID": Field(Section.PROPERTY, 0),
    "JMSType": Field(Section.PROPERTY, 3),
    "JMSCorrelationID": Field(Section.PROPERTY, 5),
    "JMSExpiration": Field(Section.PROPERTY, 8),
    "JMSTimestamp": Field(Section.PROPERTY, 9),
    "JMSPriority": Field(Section.PRIORITY),
    "JMSDeliveryMode": Field(Section.DELIVERY_MODE),
}


def _number(text: str) -> int | float:
    if text[:2].lower() == "0x":
        return int(text, 16)
    text = text.rstrip("lLfFdD")
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    for kind, value in lexemes(_LANGUAGE, _TOKEN, text):
        if kind == "number":
            tokens.append(("literal", _number(value)))
        elif kind == "string":
            tokens.append(("literal", value[1:-1].replace("''", "'")))
        elif kind == "op":
            tokens.append(("op", value))
        elif value.upper() in ("TRUE", "FALSE"):
            tokens.append(("literal", value.upper() == "TRUE"))
        elif value.upper() in _KEYWORDS:
            tokens.append(("keyword", value.upper()))
        else:
            tokens.append(("field", _JMS_FIELDS.get(value, Field(Section.APPLICATION, value))))
    return tokens


def parse_selector(text: str, views: ViewCache, clock: Clock) -> ExpressionFilter:
    """Parse a JMS selector at attach; raises :class:`~queues.errors.InvalidFilter`."""
    checked_length(_LANGUAGE, text)
    tokens = checked_tokens(_LANGUAGE, _tokens(text))
    node = Parser(_LANGUAGE, tokens, division="div").parse()
    return ExpressionFilter(text, node, views, clock)
