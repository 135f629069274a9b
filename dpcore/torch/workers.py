"""Loader worker processes die with the process that started them (Linux).

A ``DataLoader`` worker outlives a parent killed with SIGKILL: torch's own watchdog looks for the
parent only between items (every few seconds) and never while ``__getitem__`` runs, so a worker
busy with a slow record, or blocked, keeps running (and holding memory, files, a GPU) after the
training process is gone. :class:`DieWithParent` wraps the user's ``worker_init_fn``: on Linux each
worker first asks the kernel to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG,
SIGKILL)``), then checks that the parent it was started by is still there, closing the race in
which the parent died before the request. On other platforms it only calls the user's function.

The kernel sends the signal when the *thread* that started the worker exits: iterate the loader
from a thread that lives as long as its workers (normally the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DieWithParent", "die_with_parent"]

_PR_SET_PDEATHSIG = 1

#: The process that last called ``fork`` (a worker forked from it reads its parent's pid here).
_forked_from: int | None = None


def _remember_forking_process() -> None:
    global _forked_from
    _forked_from = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_remember_forking_process)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (Linux: absent from /proc, or a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def die_with_parent(parent: int | None) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; no-op elsewhere).

    Args:
        parent: the pid of the process that started this one, if known. If this process's
            parent is no longer it and it has exited (it died before the request took effect),
            this process kills itself at once.

    Returns:
        Whether the request was made (``False`` off Linux or where ``prctl`` is unavailable).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return False
    if result != 0:  # pragma: no cover - refused by a sandbox
        return False
    if parent is not None and os.getppid() != parent and _gone(parent):
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before the request
    return True


class DieWithParent:
    """A ``worker_init_fn`` that ties the worker's life to its parent, then calls the user's.

    Picklable (for the ``spawn`` start method: the parent's pid is recorded when it is pickled,
    in the parent); with ``fork`` the parent's pid is the process that forked.

    Args:
        worker_init_fn: the user's ``worker_init_fn(worker_id)``, or ``None``.
    """

    def __init__(self, worker_init_fn: Callable[[int], Any] | None) -> None:
        self.worker_init_fn = worker_init_fn
        self.parent: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"worker_init_fn": self.worker_init_fn, "parent": os.getpid()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __call__(self, worker_id: int) -> None:
        die_with_parent(self.parent if self.parent is not None else _forked_from)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
