"""The worker protocol: a run in a child process prints one result line, read by the parent.

A measurement runs in a fresh child process (a *worker*) so that its memory and timing start from
an empty heap. The worker prints exactly one line to stdout, :data:`RESULT_PREFIX` followed by a
JSON object (:func:`emit_result`); anything else it prints (progress, warnings, TensorFlow logs)
is ignored. The parent runs it with :func:`run_worker`, which never raises for what happens to the
child: a crash, a kill by the kernel's OOM killer, a timeout, a kill above a memory cap or a
line that is not a JSON object each come back as a :class:`WorkerResult` with its ``status``.

Only the standard library is imported: a worker in an environment without torch (TF Privacy's)
speaks the same protocol. Benchmarks, reproductions and audits all use it.

Example:
    >>> line = format_result({"step_seconds": 0.5, "error": None})
    >>> line
    'BENCH-RESULT {"step_seconds": 0.5, "error": null}'
    >>> find_result("progress...\\n" + line + "\\n")
    {'step_seconds': 0.5, 'error': None}
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from dpcore.errors import DPCoreError

__all__ = [
    "OOM_MARKERS",
    "POLL_SECONDS",
    "RESULT_PREFIX",
    "ResultLineError",
    "WorkerResult",
    "WorkerStatus",
    "emit_result",
    "find_result",
    "format_result",
    "is_oom",
    "parse_result_line",
    "peak_rss_mb",
    "run_worker",
    "vmrss_mb",
]

#: What a worker's one result line starts with; the rest of the line is a JSON object.
RESULT_PREFIX = "BENCH-RESULT "
#: Seconds between two reads of a watched worker's resident set (:func:`run_worker`).
POLL_SECONDS = 0.05
#: Error texts (Python, torch, the C++ allocator) that mean the process ran out of memory.
OOM_MARKERS = ("can't allocate memory", "out of memory", "MemoryError", "std::bad_alloc")
#: Characters of a failed worker's output kept in its result (the end of a traceback).
TAIL_CHARS = 1500

WorkerStatus = Literal["ok", "crashed", "unreadable", "timeout", "over_cap"]
"""What became of a worker: ``ok`` (one readable result line), ``crashed`` (it exited without
one: an exception, a signal, the kernel's OOM killer), ``unreadable`` (its result line was not
one JSON object), ``timeout`` or ``over_cap`` (the parent killed it)."""


class ResultLineError(DPCoreError, ValueError):
    """A worker's output whose result line is not exactly one line holding a JSON object."""


def format_result(row: Mapping[str, Any]) -> str:
    """The result line of ``row``: :data:`RESULT_PREFIX` and ``row`` as JSON, on one line."""
    return RESULT_PREFIX + json.dumps(dict(row))


def emit_result(row: Mapping[str, Any], file: TextIO | None = None) -> None:
    """Print the worker's one result line (to stdout unless ``file``), flushed at once."""
    print(format_result(row), file=sys.stdout if file is None else file, flush=True)


def parse_result_line(line: str) -> dict[str, Any]:
    """The JSON object of one result line.

    Raises:
        ResultLineError: the line does not start with :data:`RESULT_PREFIX`, or what follows
            is not a JSON object.

    Example:
        >>> parse_result_line('BENCH-RESULT {"error": null}')
        {'error': None}
        >>> parse_result_line("BENCH-RESULT [1, 2]")
        Traceback (most recent call last):
        ...
        dpcore.runs.workers.ResultLineError: the result line holds a list, not a JSON object
    """
    if not line.startswith(RESULT_PREFIX):
        raise ResultLineError(f"not a result line (no {RESULT_PREFIX.strip()!r} prefix)")
    try:
        value = json.loads(line.removeprefix(RESULT_PREFIX))
    except json.JSONDecodeError as error:
        raise ResultLineError(f"the result line is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ResultLineError(f"the result line holds a {type(value).__name__}, not a JSON object")
    return value


def find_result(output: str) -> dict[str, Any] | None:
    """The object of the one result line in a worker's ``output``; None if it printed none.

    The prefix may follow other text on its line (output the worker left without a newline,
    e.g. a progress bar on a shared stream).

    Raises:
        ResultLineError: a result line that is not a JSON object, or more than one.
    """
    found = [
        line[line.index(RESULT_PREFIX) :] for line in output.splitlines() if RESULT_PREFIX in line
    ]
    if not found:
        return None
    if len(found) > 1:
        raise ResultLineError(f"{len(found)} result lines, expected one")
    return parse_result_line(found[0])


def is_oom(row: Mapping[str, Any]) -> bool:
    """Whether a result row's ``error`` says the worker ran out of memory.

    True for an out-of-memory error raised in the worker (:data:`OOM_MARKERS`) and for a worker
    killed by SIGKILL without a result (``status -9``: the kernel's OOM killer).

    Example:
        >>> is_oom({"error": "RuntimeError: CUDA out of memory"}), is_oom({"error": None})
        (True, False)
        >>> is_oom({"error": "worker exited with status -9: "})
        True
    """
    error = row.get("error") or ""
    return any(marker in error for marker in OOM_MARKERS) or "status -9" in error


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What one worker process came to (see :data:`WorkerStatus`); :func:`run_worker` makes it."""

    status: WorkerStatus
    #: The object of the result line (``ok`` only).
    row: dict[str, Any] | None = None
    #: The exit status; negative: killed by that signal. None if the parent killed it.
    returncode: int | None = None
    #: The end of the worker's captured output (:data:`TAIL_CHARS`), for a failure's message.
    output: str = ""
    #: Why the result line was unreadable (``unreadable`` only).
    problem: str | None = None
    #: The largest resident set the parent read (MiB) while watching it; None if not watched.
    polled_rss_mb: float | None = None
    #: The limits it ran under (seconds, MiB), for the messages.
    timeout: float | None = None
    cap_mb: float | None = None

    @property
    def ok(self) -> bool:
        """True when the worker printed a readable result line (its row may hold an error)."""
        return self.status == "ok"

    @property
    def error(self) -> str | None:
        """One line for a failure: the row's own ``error`` when ``ok``, else what happened.

        Example:
            >>> WorkerResult("crashed", returncode=1, output="Traceback ...").error
            'worker exited with status 1: Traceback ...'
            >>> WorkerResult("timeout", timeout=300).error
            'timed out after 300 s'
        """
        if self.status == "ok":
            error = (self.row or {}).get("error")
            return None if error is None else str(error)
        if self.status == "crashed":
            return f"worker exited with status {self.returncode}: {self.output}"
        if self.status == "unreadable":
            return (
                f"worker printed an unreadable result line ({self.problem}), "
                f"status {self.returncode}: {self.output}"
            )
        if self.status == "timeout":
            return f"timed out after {self.timeout or 0:.0f} s"
        return f"killed above the memory cap of {self.cap_mb or 0:.0f} MiB"

    @property
    def oom(self) -> bool:
        """Whether the worker ran out of memory: over the cap, an out-of-memory error in its
        row or output, or killed by SIGKILL without a result (the kernel's OOM killer)."""
        if self.status == "over_cap":
            return True
        if self.status == "ok":
            return is_oom(self.row or {})
        if self.status == "crashed":
            killed = self.returncode in (-9, 137)  # 137: a shell's 128 + SIGKILL
            return killed or any(marker in self.output for marker in OOM_MARKERS)
        return False


def vmrss_mb(pid: int) -> float | None:
    """``VmRSS`` of ``pid`` in MiB, or None once the process is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB: ``VmHWM`` from ``/proc/self/status``.

    Not ``ru_maxrss``: Linux carries that counter across ``execve`` from the pre-exec image, so
    a worker started by a large parent (e.g. ``python -m reproductions`` after training) would
    report the parent's size. ``ru_maxrss`` is the fallback where ``/proc`` is absent.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def run_worker(
    command: Sequence[str],
    *,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    cap_mb: float | None = None,
    poll_seconds: float = POLL_SECONDS,
    show_stderr: bool = False,
) -> WorkerResult:
    """Run one worker ``command`` to its end and read its result line; never raises for it.

    Its stdout (and stderr, unless ``show_stderr``: then stderr goes to this process's, so
    progress bars stay visible) is collected in a temporary file. With ``cap_mb`` the parent
    reads the worker's ``VmRSS`` every ``poll_seconds`` and kills it (SIGKILL) as soon as it is
    above the cap (``over_cap``); ``RLIMIT_AS`` is not used, since torch reserves far more
    virtual memory than it touches. A worker still running after ``timeout`` seconds is killed
    (``timeout``). An interrupt of the parent (Ctrl-C) kills the worker and is raised.
    """
    polled: float | None = None if cap_mb is None else 0.0
    killed: Literal["timeout", "over_cap"] | None = None
    stderr = None if show_stderr else subprocess.STDOUT
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(list(command), cwd=cwd, stdout=out, stderr=stderr)
        started = time.perf_counter()
        try:
            if cap_mb is None:
                try:
                    process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    killed = "timeout"
            else:
                while process.poll() is None:
                    rss = vmrss_mb(process.pid)
                    if rss is not None:
                        polled = max(polled or 0.0, rss)
                        if rss > cap_mb:
                            killed = "over_cap"
                            break
                    if timeout is not None and time.perf_counter() - started > timeout:
                        killed = "timeout"
                        break
                    time.sleep(poll_seconds)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
        out.seek(0)
        text = out.read()
    tail = text.strip()[-TAIL_CHARS:]
    common: dict[str, Any] = {
        "output": tail,
        "polled_rss_mb": polled,
        "timeout": timeout,
        "cap_mb": cap_mb,
    }
    if killed is not None:
        return WorkerResult(killed, **common)
    try:
        row = find_result(text)
    except ResultLineError as error:
        return WorkerResult(
            "unreadable", returncode=process.returncode, problem=str(error), **common
        )
    if row is None:
        return WorkerResult("crashed", returncode=process.returncode, **common)
    return WorkerResult("ok", row=row, returncode=process.returncode, **common)
