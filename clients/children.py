"""Ending a client's child processes for sure.

SIGTERM is the polite way, but a process can inherit it ignored (dispositions set to
``SIG_IGN`` survive ``fork`` and ``exec``): a parent that waits for such a child to end waits
forever, and so does ``multiprocessing``'s exit handler, which joins every child it started.
So a child that has not ended ``grace`` seconds after SIGTERM gets SIGKILL.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Ending", "end"]


class Ending(Protocol):
    """What ``end`` needs of a process: ``multiprocessing``'s, or the C arrow's (quiver)."""

    @property
    def pid(self) -> int | None:
        """The process id, ``None`` before it started."""

    def is_alive(self) -> bool:
        """Started and not ended."""

    def terminate(self) -> None:
        """SIGTERM."""

    def kill(self) -> None:
        """SIGKILL."""

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for the end."""


def end(process: Ending, grace: float) -> None:
    """SIGTERM ``process`` if it runs, and SIGKILL it if it still runs ``grace`` s later."""
    if process.pid is None or not process.is_alive():
        return
    process.terminate()
    process.join(grace)
    if process.is_alive():
        process.kill()
        process.join()
