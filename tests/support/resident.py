"""A process's resident memory, read the one way the tests and the adversary read it."""

from __future__ import annotations


def rss(pid: int) -> int:
    """A process's resident set size in bytes (Linux's /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")
