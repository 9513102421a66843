"""sluicegate's import graph, read from the source: packages, modules and the circles among them.

From the repository's root::

    python tests/support/import_graph.py                    # package -> packages it imports
    python tests/support/import_graph.py --modules gateway  # module -> modules, and circles
    python tests/support/import_graph.py --dot > imports.dot  # the package graph for Graphviz

``tests/unit/test_layering.py`` checks the same graph against the rules of docs/design.md.
Imports under ``if TYPE_CHECKING:`` count as edges, as they do for a reader (``--runtime``
leaves them out: what the interpreter follows). Only the standard library is used, so the
script runs without installing anything.
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
# sluicegate's packages, lowest layer first (docs/design.md, "Packages").
PACKAGES: Final = (
    "wire",
    "transport",
    "writer",
    "queues",
    "session",
    "clients",
    "gateway",
    "cli",
    "spark",
)


def sources(*folders: str, root: Path = ROOT) -> Iterator[Path]:
    """Every Python file under ``folders`` of ``root``, in a stable order."""
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if "node_modules" not in path.parts:
                yield path


def imported(path: Path, *, typing_only: bool = True) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """Each absolute import of ``path``: its line, the module and the names taken from it.

    ``typing_only=False`` leaves out what is imported under ``if TYPE_CHECKING:``.
    """
    yield from _imports(path, typing_only)


# Read once per process: the layering tests walk the same few hundred files a dozen times.
@functools.cache
def _imports(path: Path, typing_only: bool) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    if not typing_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                skipped.update(id(child) for block in node.body for child in ast.walk(block))
    found: list[tuple[int, str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, tuple(alias.name for alias in node.names)))
    return tuple(found)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_name(path: Path, root: Path = ROOT) -> str:
    """``gateway/broker.py`` is ``sluicegate.gateway.broker``; a package is its ``__init__``."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("sluicegate", *parts))


def module_edges(*, typing_only: bool = True, root: Path = ROOT) -> dict[str, set[str]]:
    """Each sluicegate module and the sluicegate modules it imports (``typing_only=False``:
    those it imports when it runs)."""
    files = {module_name(path, root): path for path in sources(*PACKAGES, root=root)}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = edges.setdefault(name, set())
        for _, module, names in imported(path, typing_only=typing_only):
            if not module.startswith("sluicegate."):
                continue
            found = [f"{module}.{item}" for item in names if f"{module}.{item}" in files]
            targets.update(found or ([module] if module in files else []))
        targets.discard(name)
    return edges


def package_edges(edges: dict[str, set[str]]) -> Counter[tuple[str, str]]:
    """How many module imports go from each package to each other package."""
    counts: Counter[tuple[str, str]] = Counter()
    for source, targets in edges.items():
        for target in targets:
            pair = (_package(source), _package(target))
            if pair[0] != pair[1]:
                counts[pair] += 1
    return counts


def _package(module: str) -> str:
    return module.split(".")[1]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: groups of modules that import each other, directly or not (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges)))
    try:
        for node in sorted(edges):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the package graph, one package's module graph, or the package graph as DOT."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", metavar="PACKAGE", choices=PACKAGES, help="module graph")
    parser.add_argument("--dot", action="store_true", help="the package graph in Graphviz DOT")
    parser.add_argument("--runtime", action="store_true", help="leave out type-only imports")
    args = parser.parse_args(argv)
    edges = module_edges(typing_only=not args.runtime)
    if args.modules:
        inside = {m: t for m, t in edges.items() if _package(m) == args.modules}
        for module, targets in sorted(inside.items()):
            local = sorted(t.removeprefix("sluicegate.") for t in targets if t in inside)
            print(f"{module.removeprefix('sluicegate.')} -> {', '.join(local) or '-'}")
        for group in circles(inside):
            print("circle:", " <-> ".join(m.removeprefix("sluicegate.") for m in group))
        return 0
    counts = package_edges(edges)
    if args.dot:
        print("digraph sluicegate {")
        for (source, target), count in sorted(counts.items()):
            print(f'  "{source}" -> "{target}" [label="{count}"];')
        print("}")
        return 0
    for package in PACKAGES:
        imports = sorted((t, n) for (s, t), n in counts.items() if s == package)
        listed = ", ".join(f"{target} ({count})" for target, count in imports)
        print(f"{package:9} -> {listed or '-'}")
    for group in circles(edges):
        print("circle:", " <-> ".join(m.removeprefix("sluicegate.") for m in group))
    return 0


if __name__ == "__main__":
    sys.exit(main())
