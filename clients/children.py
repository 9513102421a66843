"""Ending a client's child processes for sure.

SIGTERM is the polite way, but a process can inherit it ignored (dispositions set to
``SIG_IGN`` survive ``fork`` and ``exec``): a parent that waits for such a child to end waits
forever, and so does ``multiprocessing``'s exit handler, which joins every child it started.
So a child that has not ended ``grace`` seconds after SIGTERM gets SIGKILL.
"""

from __future__ import annotations

from multiprocessing.process import BaseProcess

__all__ = ["end"]


def end(process: BaseProcess, grace: float) -> None:
    """SIGTERM ``process`` if it runs, and SIGKILL it if it still runs ``grace`` s later."""
    if process.pid is None or not process.is_alive():
        return
    process.terminate()
    process.join(grace)
    if process.is_alive():
        process.kill()
        process.join()
