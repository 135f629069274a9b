"""Fanning out measurements that must run alone: one run at a time, and the machine it ran on.

Two timings on one machine contend for its cores, caches and memory bandwidth, so a timing
cell is never run beside another. :func:`one_at_a_time` opens any executor of
:func:`~dpcore.runs.fanout.run_many` so that it is handed one run at a time
(:class:`OneAtATime`, ``max_in_flight = 1``): the next run is submitted only when the previous
one has finished, so whichever worker takes it (a process of a pool, a Dask or Ray worker, a
Slurm job) measures it with no other run of the study beside it. What else shares that machine
(another user's jobs) is the cluster's business: ask the scheduler for whole nodes. Each result
row records the machine that measured it (:func:`machine`), since successive runs may land on
different workers.

Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dpcore.errors import InvalidParameterError
from dpcore.runs.executors import ExecutorChoice, open_executor, parse_executor

__all__ = ["OneAtATime", "machine", "one_at_a_time"]


class OneAtATime:
    """An executor handing :func:`~dpcore.runs.fanout.run_many` one run at a time.

    Forwards ``submit`` (and ``renew``, for a pool that can be replaced) to ``executor``;
    ``max_in_flight = 1`` makes ``run_many`` wait for each run before it submits the next.

    Args:
        executor: any object with ``submit(fn, *args)`` (a pool, a Dask client's executor...).

    Raises:
        InvalidParameterError: ``executor`` has no ``submit``.

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> from dpcore.runs import run_many
        >>> with ThreadPoolExecutor(4) as pool:
        ...     run_many(abs, [-1, 2, -3], executor=OneAtATime(pool), progress=False)
        [1, 2, 3]
    """

    max_in_flight = 1

    def __init__(self, executor: Any) -> None:
        if not callable(getattr(executor, "submit", None)):
            raise InvalidParameterError("executor", "an object with submit()", executor)
        self.executor = executor

    def __repr__(self) -> str:
        return f"OneAtATime({self.executor!r})"

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """Submit ``fn(*args)`` to the wrapped executor."""
        return self.executor.submit(fn, *args)

    def renew(self) -> None:
        """Renew the wrapped executor, when it can be (a broken pool of spawned processes)."""
        renew = getattr(self.executor, "renew", None)
        if callable(renew):
            renew()


@contextlib.contextmanager
def one_at_a_time(executor: str | ExecutorChoice | Any | None) -> Iterator[OneAtATime | None]:
    """``executor`` opened (a string or choice) or taken as given (an object with ``submit``),
    wrapped in :class:`OneAtATime` for the block; None for None or ``"local"`` (in this
    process, where runs go one after another anyway).

    Raises:
        InvalidParameterError: ``executor`` is a string that is not a valid choice, or an object
            without ``submit`` (before anything is opened).
        EngineMissingError: the named engine is not installed.

    Example:
        >>> with one_at_a_time("local") as chosen:
        ...     chosen is None
        True
        >>> with one_at_a_time("processes:2") as chosen:
        ...     chosen.max_in_flight, chosen.submit(abs, -3).result()
        (1, 3)
    """
    if executor is None:
        yield None
        return
    if isinstance(executor, str | ExecutorChoice):
        choice = executor if isinstance(executor, ExecutorChoice) else parse_executor(executor)
        if choice.kind == "local":
            yield None
            return
        with open_executor(choice) as opened:
            yield OneAtATime(opened)
        return
    yield OneAtATime(executor)


def _proc_value(path: str, key: str) -> str | None:
    """The value of ``key`` in a ``/proc`` file (Linux), else None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    """The machine this process runs on, for a result row: host name, CPU model, logical CPUs
    (those this process may use, where the system says) and RAM in GiB (None where unknown).

    Example:
        >>> sorted(machine())
        ['cpu', 'cpus', 'host', 'ram_gib']
    """
    memory = _proc_value("/proc/meminfo", "MemTotal")  # e.g. "24683464 kB"
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return {
        "host": platform.node(),
        "cpu": _proc_value("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cpus": cpus,
        "ram_gib": None if memory is None else round(int(memory.split()[0]) / 2**20, 1),
    }
