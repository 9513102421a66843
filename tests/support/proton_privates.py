"""Reaches into proton's private attributes, read from the source (tests/unit/test_layering.py).

ruff's SLF001 sees ``other._x`` but not ``self._x`` in a subclass of a proton class where
``_x`` is the base's (``Container._collector``), nor ``setattr(obj, "_x", ...)``. This finds
all three, knowing proton's private names from proton's own source: every ``_name`` (not a
dunder) that proton's modules use as an attribute, and, for a subclass, those its proton bases
use on ``self`` or define in their bodies (a subclass's own ``self._selectable`` is not proton's
when no base of it uses that name, though proton uses it on other classes). A base class is
resolved by importing what the checked module imports, so a proton class re-exported by another
module is still proton's.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import proton

# The builtins that take an attribute's name as a string: the way around SLF001.
_BY_NAME = frozenset({"getattr", "setattr", "delattr", "hasattr"})
# Where a class a module subclasses may be proton's: importing other modules (pyspark) to look
# would be slow and find none.
_MAY_EXPORT_PROTON = frozenset({"proton", "sluicegate"})


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def proton_private_names() -> frozenset[str]:
    """Every private attribute name proton's Python modules use on any object."""
    names: set[str] = set()
    for path in Path(proton.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                names.add(node.attr)
    return frozenset(names)


def _is_protons(cls: type) -> bool:
    return cls.__module__.split(".")[0] in {"proton", "cproton"}


def _own_privates(cls: type) -> set[str]:
    """The private names a proton class uses on ``self`` or defines in its body."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and _is_private(node.attr)
        ):
            names.add(node.attr)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and _is_private(
            statement.name
        ):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name) and _is_private(t.id))
    return names


def base_privates(cls: type) -> frozenset[str]:
    """The private names of the proton classes in ``cls``'s MRO (empty if it has none)."""
    return frozenset(
        name for klass in cls.__mro__ if _is_protons(klass) for name in _own_privates(klass)
    )


def _imported_classes(tree: ast.Module) -> dict[str, type]:
    """The classes a module imports by name (``from m import C [as D]``) from proton or
    sluicegate (the only modules that could hand out a proton class), resolved by import."""
    found: dict[str, type] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] in _MAY_EXPORT_PROTON
        ):
            continue
        try:
            module = importlib.import_module(node.module)
        except ImportError:
            continue
        for alias in node.names:
            value = getattr(module, alias.name, None)
            if isinstance(value, type):
                found[alias.asname or alias.name] = value
    return found


def _base_class(base: ast.expr, classes: dict[str, type]) -> type | None:
    if isinstance(base, ast.Name):
        return classes.get(base.id)
    if isinstance(base, ast.Attribute):  # proton.reactor.Container
        dotted = ast.unparse(base.value)
        try:
            value = getattr(importlib.import_module(dotted), base.attr, None)
        except ImportError:
            return None
        return value if isinstance(value, type) else None
    return None


def private_reaches(source: str, filename: str = "<source>") -> Iterator[str]:
    """Each reach into proton's private attributes in ``source``, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    privates = proton_private_names()
    classes = _imported_classes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [cls for base in node.bases if (cls := _base_class(base, classes))]
            inherited = frozenset[str]().union(*map(base_privates, bases))
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Attribute)
                    and isinstance(inner.value, ast.Name)
                    and inner.value.id == "self"
                    and inner.attr in inherited
                ):
                    yield f"{filename}:{inner.lineno}: self.{inner.attr} of a proton base class"
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in privates
            and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
        ):
            yield f"{filename}:{node.lineno}: {ast.unparse(node)}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _BY_NAME
            and len(node.args) >= 2
            and isinstance(name := node.args[1], ast.Constant)
            and name.value in privates
        ):
            yield f"{filename}:{node.lineno}: {node.func.id}(..., {name.value!r})"
