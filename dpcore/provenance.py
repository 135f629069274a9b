"""Where a result came from: the git commit, the machine and library versions, the time.

Saved next to every result (benchmarks, reproductions, privacy statements) so a number can be
traced to the code that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import scipy

import dpcore

__all__ = ["git_commit", "provenance"]


def git_commit(root: str | Path | None = None, *, ignore: Sequence[str] = ()) -> str:
    """HEAD of the repository at ``root`` (``-dirty`` if tracked files changed), or ``unknown``.

    Defaults to the checkout dpcore is imported from; outside a git checkout (an installed
    wheel, or a copy of the tree sent to another machine) the answer is ``$DPCORE_COMMIT`` when
    set (the commit the copy was made from, suffixed ``-copy``), else ``unknown``.

    ``ignore``: paths (relative to the checkout's root) whose changes do not make it dirty --
    the results a long run rewrites as it goes, which are not the code that made them.
    """
    where = Path(root) if root is not None else Path(dpcore.__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, check=True
        ).stdout.strip()
        excluded = [f":(top,exclude){path}" for path in ignore]
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *excluded],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        declared = os.environ.get("DPCORE_COMMIT", "").strip()
        return f"{declared}-copy" if declared else "unknown"
    return head + ("-dirty" if dirty else "")


def provenance(
    *, root: str | Path | None = None, ignore: Sequence[str] = (), **extra: Any
) -> dict[str, Any]:
    """A JSON-serialisable record of the current run's context, plus ``extra`` fields.

    ``root`` is the checkout whose commit is recorded and ``ignore`` the paths whose changes do
    not count as changed code (see :func:`git_commit`).
    """
    return {
        "commit": git_commit(root, ignore=ignore),
        "dpcore": dpcore.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        **extra,
    }
