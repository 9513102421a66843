"""The import rules of docs/design.md, checked on the source: one namespace, imports point down.

Every package is ``sluicegate.<name>``; nothing imports the folders by their bare names (they
would load a second copy of a module under another name). Each package imports only the
packages below it, so the pure layers stay free of the IO shell and no import circle can form
between packages.
"""

from __future__ import annotations

from typing import Final

import pytest
from support.import_graph import PACKAGES, ROOT, circles, imported, module_edges, sources

# What each package may import of the others (docs/design.md, "Packages").
ALLOWED: Final[dict[str, frozenset[str]]] = {
    "wire": frozenset(),
    "writer": frozenset({"wire"}),
    "queues": frozenset({"wire"}),
    "session": frozenset({"queues", "writer", "wire"}),
    "clients": frozenset({"wire"}),
    "gateway": frozenset({"session", "queues", "writer", "wire", "clients"}),
    "spark": frozenset({"clients", "wire"}),
}
BARE: Final = frozenset(ALLOWED)
assert set(PACKAGES) == BARE


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_packages_below_it(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(package)
        for line, name, _ in imported(path)
        if name.startswith("sluicegate.")
        and (target := name.split(".")[1]) != package
        and target not in ALLOWED[package]
    ]
    assert wrong == []


def test_nothing_imports_a_package_by_its_bare_name() -> None:
    folders = (*sorted(ALLOWED), "tests", "bench", "examples", "sluicegate")
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(*folders)
        for line, name, _ in imported(path)
        if name.split(".")[0] in BARE
    ]
    assert wrong == []


def test_every_package_folder_is_linked_into_the_namespace() -> None:
    for package in ALLOWED:
        link = ROOT / "sluicegate" / package
        assert link.is_symlink(), link
        assert link.resolve() == ROOT / package


def test_no_module_imports_itself_through_others_when_it_runs() -> None:
    assert circles(module_edges(typing_only=False)) == []


def test_only_the_quarantine_imports_protons_private_modules() -> None:
    """proton's private modules (``proton._selectable`` and the like) are reached through
    gateway/proton/internals.py alone, as its private attributes are (ruff's SLF001)."""
    quarantine = ROOT / "gateway" / "proton" / "internals.py"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(*PACKAGES)
        if path != quarantine
        for line, name, _ in imported(path)
        if name.startswith("proton._")
    ]
    assert wrong == []
