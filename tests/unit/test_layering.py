"""The import rules of docs/design.md, checked on the source: one namespace, imports point down.

Every package is ``sluicegate.<name>``; nothing imports the folders by their bare names (they
would load a second copy of a module under another name). Each package imports only the
packages below it, so the pure layers stay free of the IO shell and no import circle can form
between packages.
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
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
    gateway/proton_internals.py alone, as its private attributes are (ruff's SLF001)."""
    quarantine = ROOT / "gateway" / "proton_internals.py"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(*PACKAGES)
        if path != quarantine
        for line, name, _ in imported(path)
        if name.startswith("proton._")
    ]
    assert wrong == []


# What gateway/rules/ may not import at all: the broker's decisions are made without IO or a
# clock, like the pure packages' (time is an argument).
_IMPURE: Final = frozenset(
    {"proton", "cproton", "socket", "select", "selectors", "time", "asyncio"}
)


_RULES: Final = "sluicegate.gateway.rules."


def test_the_broker_s_decisions_import_nothing_of_the_shell() -> None:
    """gateway/rules/ sits below the shell: it imports the pure packages and itself, never
    another gateway module, proton, a socket or the clock."""
    rules = ROOT / "gateway" / "rules"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources("gateway/rules")
        for line, name, _ in imported(path)
        if name.split(".")[0] in _IMPURE
        or (
            name.startswith("sluicegate.gateway")
            and not name.startswith("sluicegate.gateway.rules")
        )
    ]
    assert rules.is_dir()
    assert wrong == []


def test_ruffs_ban_on_io_covers_the_broker_s_decisions() -> None:
    """The shell's TID251 ignores (pyproject.toml) cover every gateway module but gateway/rules/:
    ruff's globs cross folders as fnmatch's do, so a pattern like ``gateway/**`` would also
    lift the ban on the rules."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ignores = settings["tool"]["ruff"]["lint"]["per-file-ignores"]
    lifting = [pattern for pattern, codes in ignores.items() if "TID251" in codes]
    gateway = [path.relative_to(ROOT).as_posix() for path in sources("gateway")]
    rules = [path for path in gateway if path.startswith("gateway/rules/")]
    assert rules
    assert [path for path in rules if any(fnmatch(path, glob) for glob in lifting)] == []
    shell = [path for path in gateway if path not in rules]
    assert [path for path in shell if not any(fnmatch(path, glob) for glob in lifting)] == []
