"""``run_many``: many runs, in this process or fanned out over an executor, results from the store.

Results on disk are the truth and futures are only progress: specs whose result is already in
the store are not submitted, and a run whose future fails is counted as finished when its
result is in the store after all (the worker died after writing it). Every other failure (an
exception, a worker that died, a pool that broke) is retried up to ``retries`` times; the runs
still failing then are reported together, after every other run has finished, in a
:class:`~dpcore.runs.errors.RunsFailedError`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol, TypeVar

from dpcore.errors import InvalidParameterError
from dpcore.runs.errors import RunsFailedError
from dpcore.runs.executors import ExecutorChoice, open_executor, parse_executor
from dpcore.runs.spec import check_spec
from dpcore.runs.store import _MISSING, RunStore, StoredRun

__all__ = ["SupportsSubmit", "run_many"]

S = TypeVar("S", bound=Hashable)


class _Future(Protocol):
    def result(self) -> Any: ...


class SupportsSubmit(Protocol):
    """Anything with ``submit(fn, *args)`` returning an object with ``result()``.

    Optional members that :func:`run_many` uses when present: ``done()`` on the futures (to
    collect them as they finish), ``max_in_flight`` (hand over at most that many runs at a
    time), ``renew()`` (replace a broken executor), ``submit_many(fn, items)`` (one batch, a
    Slurm job array).
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> _Future: ...


class _Progress:
    """A tqdm bar over finished specs when tqdm is installed and ``enabled``; else nothing."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, initial=initial, desc="runs", unit="run")

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_many(
    execute: Callable[..., Any],
    specs: Iterable[S],
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    store: RunStore | None = None,
    progress: bool = True,
    retries: int = 1,
    with_folder: bool = False,
    poll_seconds: float = 0.1,
) -> list[Any]:
    """``[execute(spec) for spec in specs]``, stored, resumable, in process or fanned out.

    Args:
        execute: a module-level function of the spec (picklable; with ``with_folder=True``, of
            the spec and its folder in the store) returning JSON values.
        specs: the runs; frozen dataclasses when ``store`` is given, else any hashable values.
            A spec given twice is run once.
        executor: None or ``"local"`` (in this process, one run after another),
            ``"processes:N"``, ``"dask[:ADDRESS]"``, ``"ray[:ADDRESS]"``, ``"slurm"`` (opened with
            default options and closed at the end; see :func:`~dpcore.runs.executors.open_executor`
            for options), or any object with ``submit()`` (left open).
        store: where results live; runs already in it are not run again. Without a store
            nothing is written and every spec is run.
        progress: show a bar over finished specs (tqdm, when installed).
        retries: how many more times a run that raised or whose worker died is tried.
        with_folder: pass each run its folder in the store (see
            :class:`~dpcore.runs.store.StoredRun`); needs ``store``.
        poll_seconds: how often futures without ``concurrent.futures`` waiting are polled.

    Returns:
        The results in the order of ``specs`` (from the store, as JSON values, when a store is
        given).

    Raises:
        InvalidParameterError: a spec is invalid (before anything runs), ``retries`` or
            ``poll_seconds`` is out of range, ``executor`` is not a valid choice, or
            ``with_folder`` is set without a store.
        EngineMissingError: the named engine is not installed.
        RunsFailedError: runs still failed after their retries (raised once every other run
            has finished; those are stored).

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> run_many(abs, [-1, 2, -3], progress=False)
        [1, 2, 3]
        >>> with ThreadPoolExecutor(2) as pool:
        ...     run_many(abs, [-1, 2, -1], executor=pool, progress=False)
        [1, 2, 1]
    """
    specs = list(specs)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidParameterError("retries", "an int >= 0", retries)
    if not (isinstance(poll_seconds, int | float) and 0 < poll_seconds <= 60):
        raise InvalidParameterError("poll_seconds", "in (0, 60]", poll_seconds)
    if with_folder and store is None:
        raise InvalidParameterError("with_folder", "False when no store is given", with_folder)
    for spec in specs:
        if store is not None:
            check_spec(spec)
        else:
            try:
                hash(spec)
            except TypeError:
                raise InvalidParameterError("specs", "hashable values", spec) from None
    choice: ExecutorChoice | None = None
    if isinstance(executor, str | ExecutorChoice):
        choice = executor if isinstance(executor, ExecutorChoice) else parse_executor(executor)
    elif executor is not None and not callable(getattr(executor, "submit", None)):
        raise InvalidParameterError(
            "executor", "None, a string or an object with submit()", executor
        )

    unique = list(dict.fromkeys(specs))
    results: dict[Any, Any] = {}
    if store is not None:
        for spec in unique:
            value = store._read(spec)
            if value is not _MISSING:
                results[spec] = value
    pending = [spec for spec in unique if spec not in results]
    run: Callable[[Any], Any] = (
        StoredRun(execute, store, with_folder=with_folder) if store is not None else execute
    )
    failures: dict[Any, BaseException] = {}
    bar = _Progress(len(unique), len(results), progress)
    try:
        if pending and choice is not None and choice.kind != "local":
            with open_executor(choice) as opened:
                _fan_out(run, pending, opened, store, retries, poll_seconds, results, failures, bar)
        elif pending and executor is not None and choice is None:
            _fan_out(run, pending, executor, store, retries, poll_seconds, results, failures, bar)
        else:
            _in_process(run, pending, retries, results, failures, bar)
    finally:
        bar.close()
    if failures:
        raise RunsFailedError([(s, failures[s]) for s in unique if s in failures], retries + 1)
    return [results[spec] for spec in specs]


def _in_process(
    run: Callable[[Any], Any],
    pending: list[Any],
    retries: int,
    results: dict[Any, Any],
    failures: dict[Any, BaseException],
    bar: _Progress,
) -> None:
    for spec in pending:
        for _ in range(retries + 1):
            try:
                results[spec] = run(spec)
            except Exception as error:  # a failed run is retried, then reported
                failures[spec] = error
            else:
                failures.pop(spec, None)
                bar.update()
                break


def _fan_out(
    run: Callable[[Any], Any],
    pending: list[Any],
    executor: Any,
    store: RunStore | None,
    retries: int,
    poll_seconds: float,
    results: dict[Any, Any],
    failures: dict[Any, BaseException],
    bar: _Progress,
) -> None:
    """Submit ``pending`` to ``executor``, collect as they finish, retry what failed."""
    limit = max(1, getattr(executor, "max_in_flight", None) or len(pending))
    queue = collections.deque(pending)
    attempts = dict.fromkeys(pending, 0)
    in_flight: dict[Any, tuple[Any, int]] = {}  # future -> (spec, executor generation)
    generation = 0

    def settle(spec: Any, future_generation: int, error: BaseException | None, value: Any) -> None:
        nonlocal generation
        if error is None:
            if store is not None:  # the disk is the truth; store what a remote disk kept
                stored_value = store._read(spec)
                if stored_value is _MISSING:
                    store.put(spec, value)
                    stored_value = store._read(spec)
                value = stored_value
            results[spec] = value
            bar.update()
            return
        if store is not None and store.has(spec):  # died after storing: finished after all
            results[spec] = store.result(spec)
            bar.update()
            return
        if isinstance(error, concurrent.futures.BrokenExecutor) and future_generation == generation:
            renew = getattr(executor, "renew", None)
            if callable(renew):
                renew()
                generation += 1
        if attempts[spec] <= retries:
            queue.append(spec)
        else:
            failures[spec] = error

    while queue or in_flight:
        batch: list[Any] = []
        while queue and len(in_flight) + len(batch) < limit:
            batch.append(queue.popleft())
        for spec in batch:
            attempts[spec] += 1
        submit_many = getattr(executor, "submit_many", None)
        if len(batch) > 1 and callable(submit_many):
            try:
                futures = list(submit_many(run, batch))
            except Exception as error:
                for spec in batch:
                    settle(spec, generation, error, None)
                continue
            for spec, future in zip(batch, futures, strict=True):
                in_flight[future] = (spec, generation)
        else:
            for spec in batch:
                try:
                    future = executor.submit(run, spec)
                except Exception as error:
                    settle(spec, generation, error, None)
                    continue
                in_flight[future] = (spec, generation)
        if not in_flight:
            continue
        for future in _finished(list(in_flight), poll_seconds):
            spec, future_generation = in_flight.pop(future)
            try:
                value = future.result()
            except Exception as error:  # the run raised, or its worker died
                settle(spec, future_generation, error, None)
            else:
                settle(spec, future_generation, None, value)


def _finished(futures: list[Any], poll_seconds: float) -> list[Any]:
    """Some finished futures, waiting until there is at least one."""
    if all(isinstance(f, concurrent.futures.Future) for f in futures):
        finished, _ = concurrent.futures.wait(
            futures, return_when=concurrent.futures.FIRST_COMPLETED
        )
        return [f for f in futures if f in finished]
    if not all(callable(getattr(f, "done", None)) for f in futures):
        return futures[:1]  # no way to tell which is done: wait for the oldest
    delay = poll_seconds
    while True:
        done = [f for f in futures if f.done()]
        if done:
            return done
        time.sleep(delay)
        delay = min(2 * delay, 5.0, max(poll_seconds, 1.0))
