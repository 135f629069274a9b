"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Every file dpcore writes goes through :func:`atomic_path` (or its two helpers). Each write goes
to a unique temporary file in the target's directory, is flushed to disk, and then replaces the
target with :func:`os.replace`, which is atomic on POSIX and Windows when both paths are on one
file system; on POSIX the directory is flushed too, so the rename survives a power cut. The
written file keeps the permissions of the file it replaces, or gets those of a new file under
the process's umask (not the temporary file's private 0600).

A process killed mid-write (SIGKILL, power loss) cannot remove its temporary file. Temporary
names therefore say who wrote them, ``.{target}.{pid}-{host}.{random}.part`` (``host``: 8 hex
digits of a hash of the machine's name), and every atomic write to a target first removes the
temporaries *of that same target* written on this machine by a process that no longer exists.
A live writer's temporary (same or other process, or another machine sharing the folder) is
never touched; a process id reused by a new process only delays the removal.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "remove_stale_temporaries",
    "temporary_prefix",
]

_HOST = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]
_SUFFIX = ".part"


def temporary_prefix(target: str | Path, pid: int | None = None) -> str:
    """The start of the names of ``target``'s temporary files written by process ``pid``.

    Example:
        >>> temporary_prefix("/data/run.pt", pid=42).startswith(".run.pt.42-")
        True
    """
    return f".{Path(target).name}.{os.getpid() if pid is None else pid}-{_HOST}."


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a zombie counts as gone).

    Off POSIX every writer counts as alive (``os.kill(pid, 0)`` would send CTRL_C_EVENT on
    Windows), so nothing is removed there.
    """
    if pid == os.getpid() or os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):  # exists, owned by someone else (or we cannot tell)
        return True
    try:  # Linux: a killed child nobody has reaped yet is a zombie; it writes nothing more
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] not in ("Z", "X")


def remove_stale_temporaries(target: str | Path) -> list[Path]:
    """Remove ``target``'s temporary files left by writers on this machine that no longer exist.

    Only names of the form ``.{target name}.{pid}-{host}.{random}.part`` with this machine's
    ``host`` are considered, and only those whose ``pid`` is not a live process; returns what was
    removed.

    Example:
        >>> folder = Path(tempfile.mkdtemp())
        >>> dead = folder / (temporary_prefix(folder / "x.json", pid=2**22 + 1) + "abc.part")
        >>> live = folder / (temporary_prefix(folder / "x.json") + "def.part")
        >>> _ = dead.write_text("half"), live.write_text("half")
        >>> [p.name == dead.name for p in remove_stale_temporaries(folder / "x.json")]
        [True]
        >>> sorted(p.name for p in folder.iterdir()) == [live.name]
        True
    """
    target = Path(target)
    pattern = re.compile(
        re.escape(f".{target.name}.")
        + r"(\d+)-"
        + re.escape(_HOST)
        + r"\.[^./]+"
        + re.escape(_SUFFIX)
    )
    removed: list[Path] = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):  # another writer removed it first
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _umask() -> int:
    """The process's umask: from ``/proc/self/status`` where Linux gives it (thread-safe), else
    by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)  # pragma: no cover - off Linux
    os.umask(current)  # pragma: no cover
    return current  # pragma: no cover


def _mode_for(target: Path) -> int:
    """The permissions the written file gets: the replaced file's own, else what ``open()``
    would give a new file (``0o666`` less the umask), so results, checkpoints and statements
    are as readable as the user's other files (a shared results folder on a cluster)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _fsync_directory(folder: Path) -> None:
    """Flush a directory entry (the rename) to disk; a no-op where directories cannot be opened."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(handle)
    except OSError:  # pragma: no cover - file systems that refuse fsync on a directory
        pass
    finally:
        os.close(handle)


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``target``; on success it replaces ``target``.

    The block writes the temporary file however it likes (``torch.save``, ``np.save``...); if the
    block raises, the temporary file is removed and ``target`` is left untouched. Stale
    temporaries of ``target`` (see the module docstring) are removed first.

    Example:
        >>> folder = Path(tempfile.mkdtemp())
        >>> with atomic_path(folder / "result.txt") as temporary:
        ...     _ = temporary.write_text("done")
        >>> (folder / "result.txt").read_text(), sorted(p.name for p in folder.iterdir())
        ('done', ['result.txt'])
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    handle, name = tempfile.mkstemp(
        dir=target.parent, prefix=temporary_prefix(target), suffix=_SUFFIX
    )
    os.close(handle)
    temporary = Path(name)
    try:
        os.chmod(temporary, _mode_for(target))  # mkstemp's 0600 is for the temporary only
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, target)
        _fsync_directory(target.parent)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write_bytes(target: str | Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (see :func:`atomic_path`)."""
    with atomic_path(target) as temporary:
        temporary.write_bytes(data)


def atomic_write_text(target: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically (see :func:`atomic_path`)."""
    atomic_write_bytes(target, text.encode("utf-8"))
