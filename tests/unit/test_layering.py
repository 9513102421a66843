"""The import rules of docs/design.md, checked on the source: one namespace, imports point down.

Every package is ``sluicegate.<name>``; nothing imports the folders by their bare names (they
would load a second copy of a module under another name). Each package imports only the
packages below it, so the pure layers stay free of the IO shell and no import circle can form
between packages.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from support.import_graph import PACKAGES, ROOT, circles, imported, module_edges, sources
from support.proton_privates import private_reaches

# What each package may import of the others (docs/design.md, "Packages").
ALLOWED: Final[dict[str, frozenset[str]]] = {
    "wire": frozenset(),
    "transport": frozenset(),
    "writer": frozenset({"wire"}),
    "queues": frozenset({"wire"}),
    "session": frozenset({"queues", "writer", "wire"}),
    "clients": frozenset({"wire", "transport"}),
    "gateway": frozenset({"session", "queues", "writer", "wire", "transport"}),
    "cli": frozenset({"gateway", "clients", "session", "queues", "writer", "wire", "transport"}),
    "spark": frozenset({"clients", "wire", "transport"}),
}
BARE: Final = frozenset(ALLOWED)
# The proton quarantine (docs/design.md), and the clients' one reach into proton's C layer and
# private parts: the clients may not import the server, so they cannot share the quarantine.
QUARANTINE: Final = ROOT / "gateway" / "proton"
CLIENTS_EXCEPTION: Final = ROOT / "clients" / "capi.py"
C_LAYER: Final = frozenset({"cproton", "cproton_ffi", "cffi", "ctypes"})
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


def test_the_server_imports_neither_the_clients_nor_the_command_line() -> None:
    """What the server shares with the clients is in transport/; the command line is the
    composition root above both (docs/design.md)."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources("gateway")
        for line, name, _ in imported(path)
        if name.split(".")[:2] in (["sluicegate", "clients"], ["sluicegate", "cli"])
    ]
    assert wrong == []


@pytest.mark.slow
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


def _outside_the_quarantine() -> Iterator[Path]:
    """Every source file but the proton quarantine's and its one documented exception."""
    for path in sources(*PACKAGES):
        if QUARANTINE not in path.parents and path != CLIENTS_EXCEPTION:
            yield path


def test_only_the_quarantine_imports_protons_private_modules() -> None:
    """proton's private modules (``proton._selectable`` and the like) are reached through
    gateway/proton/ alone, as its private attributes are."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _outside_the_quarantine()
        for line, name, _ in imported(path)
        if name.startswith("proton._")
    ]
    assert wrong == []


@pytest.mark.slow
def test_only_the_quarantine_calls_protons_c_layer() -> None:
    """ruff's banned-api says the same; this holds whatever a per-file-ignore lets through."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _outside_the_quarantine()
        for line, name, _ in imported(path)
        if name.split(".")[0] in C_LAYER
    ]
    assert wrong == []


@pytest.mark.slow
def test_only_the_quarantine_reaches_protons_private_attributes() -> None:
    """Including ``self._x`` in a subclass of a proton class where ``_x`` is the base's, and
    ``setattr(obj, "_x", ...)``, which ruff's SLF001 does not see."""
    wrong = [
        reach
        for path in _outside_the_quarantine()
        for reach in private_reaches(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert wrong == []


PLANTED_SUBCLASS = """
from proton.reactor import Container


class Loop(Container):
    def __init__(self) -> None:
        super().__init__()
        self._mine = 0

    def process(self) -> bool:
        self._mine += 1
        return self._yield
"""


def test_the_check_reports_a_planted_subclass_reaching_into_its_proton_base() -> None:
    """``Container._yield`` is the base's; ``_mine`` is the subclass's own and passes."""
    assert list(private_reaches(PLANTED_SUBCLASS, "planted.py")) == [
        "planted.py:12: self._yield of a proton base class"
    ]


def test_the_check_reports_a_planted_base_reached_through_another_module() -> None:
    """A proton class re-exported by the quarantine is still proton's."""
    planted = (
        "from sluicegate.gateway.proton.internals import Selectable\n"
        "class Pipe(Selectable):\n"
        "    def peek(self) -> object:\n"
        "        return self._reactor\n"
    )
    assert list(private_reaches(planted, "planted.py")) == [
        "planted.py:4: self._reactor of a proton base class"
    ]


def test_the_check_reports_planted_reaches_on_other_objects_and_by_name() -> None:
    planted = (
        "def tie(selectable: object, transport: object, link: object) -> object:\n"
        "    setattr(selectable, '_transport', transport)\n"
        "    return link._impl\n"
    )
    assert sorted(private_reaches(planted, "planted.py")) == [
        "planted.py:2: setattr(..., '_transport')",
        "planted.py:3: link._impl",
    ]


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
    """gateway/rules/ takes the pure packages' bans (ruff-pure.toml) through its own ruff.toml:
    pyproject.toml's bans cover only proton's C layer, which the shell needs lifted."""
    settings = tomllib.loads((ROOT / "gateway" / "rules" / "ruff.toml").read_text())
    assert settings["extend"] == "../../ruff-pure.toml"
    pure = tomllib.loads((ROOT / "ruff-pure.toml").read_text())
    banned = pure["lint"]["flake8-tidy-imports"]["banned-api"]
    assert _IMPURE - {"select", "selectors"} <= set(banned)
