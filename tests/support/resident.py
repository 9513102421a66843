"""A process's resident memory, read the one way the tests and the adversary read it."""

from __future__ import annotations


def rss(pid: int) -> int:
    """A process's resident set size in bytes (Linux's /proc)."""
    found = resident(pid)
    if found is None:
        raise AssertionError(f"no VmRSS for process {pid}")
    return found


def resident(pid: int) -> int | None:
    """A process's resident set size in bytes; None for one that has ended: gone, or a zombie
    (which has no resident set) until its parent reaps it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
