"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Each write goes to a unique temporary file in the target's directory (two writers never share
a name), is flushed to disk, and then replaces the target with :func:`os.replace`, which is
atomic on POSIX and Windows when both paths are on one file system.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``target``; on success it replaces ``target``.

    The block writes the temporary file however it likes (``torch.save``, ``np.save``...); if the
    block raises, the temporary file is removed and ``target`` is left untouched.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> with atomic_path(folder / "result.txt") as temporary:
        ...     _ = temporary.write_text("done")
        >>> (folder / "result.txt").read_text(), sorted(p.name for p in folder.iterdir())
        ('done', ['result.txt'])
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write_bytes(target: str | Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (see :func:`atomic_path`)."""
    with atomic_path(target) as temporary:
        temporary.write_bytes(data)


def atomic_write_text(target: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically (see :func:`atomic_path`)."""
    atomic_write_bytes(target, text.encode("utf-8"))
