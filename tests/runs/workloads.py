"""Module-level workloads for the run-layer tests (importable by spawned, Dask and Ray workers).

Each call of :func:`compute` leaves a marker file in ``$DPCORE_TEST_CALLS`` (when set), so a test
can count how often each spec was really computed, across processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from dpcore.runs import spec_key

CALLS = "DPCORE_TEST_CALLS"


@dataclasses.dataclass(frozen=True)
class Spec:
    """One test run: ``index`` picks the result; ``seconds`` makes it take that long."""

    index: int
    size: int = 4
    seconds: float = 0.0
    kill_once: bool = False


def record_call(spec: Spec) -> None:
    folder = os.environ.get(CALLS)
    if folder:
        name = f"{spec_key(spec)}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        Path(folder, name).touch()


def calls(folder: Path) -> dict[str, int]:
    """How many times each spec key was computed."""
    counts: dict[str, int] = {}
    for path in folder.iterdir():
        if path.name.startswith("killed-"):
            continue
        key = path.name.split("-")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


def compute(spec: Spec) -> dict[str, Any]:
    """A deterministic result of the spec (floats included); sleeps ``spec.seconds`` first.

    With ``kill_once``, the first call SIGKILLs its own process (a marker in ``$DPCORE_TEST_CALLS``
    remembers it), as an out-of-memory kill would.
    """
    if spec.kill_once:
        marker = Path(os.environ[CALLS], f"killed-{spec_key(spec)}")
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
    record_call(spec)
    if spec.seconds:
        time.sleep(spec.seconds)
    digest = hashlib.sha256(f"{spec.index}".encode()).digest()
    values = [byte / 255 for byte in digest[: spec.size]]
    return {
        "index": spec.index,
        "values": values,
        "total": sum(values),
        "name": f"run {spec.index}",
    }


def die_if_odd(spec: Spec) -> dict[str, Any]:
    """SIGKILLs its own process for odd indices, every time; computes the others."""
    if spec.index % 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return compute(spec)


def fail_always(spec: Spec) -> dict[str, Any]:
    """Raises for odd indices, computes the others."""
    if spec.index % 2:
        raise ArithmeticError(f"run {spec.index} cannot be computed")
    return compute(spec)


def gpu_ids(spec: Spec) -> list[str]:
    """The GPUs Ray gave this run (a Ray task only)."""
    import ray

    return [str(gpu) for gpu in ray.get_gpu_ids()]
