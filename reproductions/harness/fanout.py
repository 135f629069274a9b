"""Running many specs: in order in this process, or fanned out over any executor.

``run_many(execute, specs, executor=None)`` calls ``execute(spec)`` for each spec. With no
executor the runs go one after another here; with anything that has
``submit(fn, *args) -> future`` (a :class:`concurrent.futures.ProcessPoolExecutor` built with a
``spawn`` context, submitit's or Dask's executors) they fan out. ``execute`` must be a
module-level function of its spec alone (picklable) that writes its result into the run store;
results come back in the order of ``specs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

__all__ = ["Executor", "run_many"]

S = TypeVar("S")
R = TypeVar("R")


class _Future(Protocol):
    def result(self) -> Any: ...


class Executor(Protocol):
    """Anything with ``submit(fn, *args)`` returning an object with ``result()``."""

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> _Future: ...


def run_many(
    execute: Callable[[S], R], specs: Iterable[S], executor: Executor | None = None
) -> list[R]:
    """``[execute(spec) for spec in specs]``, in-process or through ``executor``.

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> run_many(abs, [-1, 2, -3]), run_many(abs, [-1, 2], ThreadPoolExecutor(2))
        ([1, 2, 3], [1, 2])
    """
    if executor is None:
        return [execute(spec) for spec in specs]
    futures = [executor.submit(execute, spec) for spec in specs]
    return [future.result() for future in futures]
