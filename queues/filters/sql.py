"""AMQP SQL filter expressions (``amqp:sql-filter``, RabbitMQ 4.2's ``sql-filter``).

The OASIS AMQP Filter Expressions' SQL language as RabbitMQ 4.2 reads it: upper-case keywords
(a keyword in other case is a reserved word, refused as an identifier), strings in single or
double quotes, ``0x`` binary constants, ``!=`` beside ``<>``, ``UTC()``, and exact division.
Identifiers name application properties (``key``, ``a.key``, ``application_properties.key``,
``[any key]`` with ``[[``/``]]`` for brackets) or message fields by section:
``header.priority`` (``h.``) and the properties section's fields with underscores
(``properties.subject``, ``p.correlation_id``...). Grammar and evaluation are shared with JMS
selectors (queues.filters.parser, queues.filters.expression); this module owns the tokens.
"""

from __future__ import annotations

import re
from typing import Final

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.expression import ExpressionFilter, Field, Section
from sluicegate.queues.filters.parser import (
    Parser,
    Token,
    checked_length,
    checked_tokens,
    lexemes,
)
from sluicegate.queues.filters.properties import PROPERTY_FIELDS
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.queue_type import Clock

SQL_FILTER: Final = 0x120
SQL_DESCRIPTOR: Final = "amqp:sql-filter"
# The filter-set key RabbitMQ reads an SQL expression under.
SQL_FILTER_KEY: Final = "sql-filter"
_LANGUAGE: Final = "sql-filter"

_TOKEN: Final = re.compile(
    r"""[\s]*(?:
        (?P<binary>0[xX](?:[0-9A-Fa-f]{2})+)
      | (?P<float>\d+\.\d+(?:[eE][+-]?\d+)?)
      | (?P<integer>\d+)
      | (?P<string>'(?:[^']|'')*'|"(?:[^"]|"")*")
      | (?P<section>[A-Za-z][A-Za-z_-]*\.[A-Za-z][A-Za-z0-9_]*)
      | (?P<delimited>\[(?:[^\[\]]|\[\[|\]\])*\])
      | (?P<name>[A-Za-z][A-Za-z0-9_]*)
      | (?P<op><>|!=|<=|>=|[=<>()+\-*/,%])
    )""",
    re.VERBOSE,
)
_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "UTC"}
)
# Words the OASIS grammar reserves (RabbitMQ refuses them as identifiers in any case).
_RESERVED: Final = frozenset(
    {
        *(k.lower() for k in _KEYWORDS),
        "true",
        "false",
        "exists",
        "nan",
        "inf",
        "lower",
        "upper",
        "left",
        "right",
        "substring",
        "date",
    }
)
_HEADER_PREFIXES: Final = frozenset({"header", "h"})
_PROPERTIES_PREFIXES: Final = frozenset({"properties", "p"})
_APPLICATION_PREFIXES: Final = frozenset({"application_properties", "a"})
_PROPERTY_INDEX: Final = {name.replace("-", "_"): i for i, name in enumerate(PROPERTY_FIELDS)}


def _section_field(text: str) -> Field:
    prefix, _, name = text.partition(".")
    if prefix in _HEADER_PREFIXES and name == "priority":
        return Field(Section.PRIORITY)
    if prefix in _PROPERTIES_PREFIXES and name in _PROPERTY_INDEX:
        return Field(Section.PROPERTY, _PROPERTY_INDEX[name])
    if prefix in _APPLICATION_PREFIXES:
        return Field(Section.APPLICATION, name)
    raise InvalidFilter(f"{_LANGUAGE}: unsupported field {text!r}")


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    for kind, value in lexemes(_LANGUAGE, _TOKEN, text):
        if kind == "binary":
            tokens.append(("literal", bytes.fromhex(value[2:])))
        elif kind == "float":
            tokens.append(("literal", float(value)))
        elif kind == "integer":
            tokens.append(("literal", int(value)))
        elif kind == "string":
            quote = value[0]
            tokens.append(("literal", value[1:-1].replace(quote * 2, quote)))
        elif kind == "section":
            tokens.append(("field", _section_field(value)))
        elif kind == "delimited":
            key = value[1:-1].replace("[[", "[").replace("]]", "]")
            tokens.append(("field", Field(Section.APPLICATION, key)))
        elif kind == "op":
            tokens.append(("op", "<>" if value == "!=" else value))
        elif value in ("TRUE", "FALSE"):
            tokens.append(("literal", value == "TRUE"))
        elif value in _KEYWORDS:
            tokens.append(("keyword", value))
        elif value.lower() in _RESERVED:
            raise InvalidFilter(f"{_LANGUAGE}: {value!r} is reserved (keywords are upper case)")
        else:
            tokens.append(("field", Field(Section.APPLICATION, value)))
    return tokens


def parse_sql(text: str, views: ViewCache, clock: Clock) -> ExpressionFilter:
    """Parse an SQL filter expression at attach; raises :class:`~queues.errors.InvalidFilter`."""
    checked_length(_LANGUAGE, text)
    tokens = checked_tokens(_LANGUAGE, _tokens(text))
    node = Parser(_LANGUAGE, tokens, division="/").parse()
    return ExpressionFilter(text, node, views, clock)
