"""Executors for :func:`~dpcore.runs.fanout.run_many`: a spawn pool, Dask, Ray and Slurm.

``--executor`` takes ``local``, ``processes:N``, ``dask[:ADDRESS]``, ``ray[:ADDRESS]`` or
``slurm`` (:func:`parse_executor`); :func:`open_executor` turns the choice into an object with
``submit(fn, *args)`` and closes what it started when the block ends. The engines are optional
extras (``pip install "dpcore[dask]"``, ``"dpcore[ray]"``, ``"dpcore[slurm]"``) and are imported
only here, only when asked for: a missing one raises :class:`~dpcore.runs.errors.EngineMissingError`
naming the extra.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from dpcore.errors import InvalidParameterError
from dpcore.runs.errors import EngineMissingError

__all__ = [
    "EXECUTOR_FORMS",
    "ExecutorChoice",
    "RayExecutor",
    "SpawnPool",
    "SubmititExecutor",
    "open_executor",
    "parse_executor",
]

#: What ``--executor`` accepts, as error messages and ``--help`` state it.
EXECUTOR_FORMS = "local, processes[:N] (N >= 1), dask[:ADDRESS], ray[:ADDRESS] or slurm"

Kind = Literal["local", "processes", "dask", "ray", "slurm"]


@dataclasses.dataclass(frozen=True)
class ExecutorChoice:
    """A parsed ``--executor`` value.

    Attributes:
        kind: ``"local"`` (in this process), ``"processes"``, ``"dask"``, ``"ray"`` or ``"slurm"``.
        workers: the number of spawned processes (``processes`` only).
        address: the scheduler (Dask) or cluster (Ray) to connect to; None starts a local one.
    """

    kind: Kind
    workers: int | None = None
    address: str | None = None


def parse_executor(text: str) -> ExecutorChoice:
    """Parse ``local``, ``processes:N``, ``dask[:ADDRESS]``, ``ray[:ADDRESS]`` or ``slurm``.

    ``processes`` alone means one process per CPU. Addresses are kept as given (``tcp://...``
    for Dask, ``auto`` or ``ray://...`` for Ray).

    Raises:
        InvalidParameterError: any other value.

    Example:
        >>> parse_executor("processes:4")
        ExecutorChoice(kind='processes', workers=4, address=None)
        >>> parse_executor("dask:tcp://10.0.0.1:8786").address
        'tcp://10.0.0.1:8786'
        >>> parse_executor("threads:2")
        Traceback (most recent call last):
        ...
        dpcore.errors.InvalidParameterError: Expected executor one of local, processes[:N] \
(N >= 1), dask[:ADDRESS], ray[:ADDRESS] or slurm, got 'threads:2'.
    """
    if not isinstance(text, str):
        raise InvalidParameterError("executor", f"one of {EXECUTOR_FORMS}", text)
    kind, colon, rest = text.strip().partition(":")
    if colon and not rest:
        raise InvalidParameterError("executor", f"one of {EXECUTOR_FORMS}", text)
    if kind in ("local", "slurm") and not colon:
        return ExecutorChoice(kind)  # type: ignore[arg-type]
    if kind == "processes":
        if not colon:
            return ExecutorChoice("processes", workers=os.cpu_count() or 1)
        if rest.isascii() and rest.isdigit() and int(rest) >= 1:
            return ExecutorChoice("processes", workers=int(rest))
    if kind in ("dask", "ray"):
        return ExecutorChoice(kind, address=rest or None)  # type: ignore[arg-type]
    raise InvalidParameterError("executor", f"one of {EXECUTOR_FORMS}", text)


def _engine(executor: str, extra: str, module: str) -> ModuleType:
    """Import an engine's module, or raise the typed error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise EngineMissingError(executor, extra, module) from None


class SpawnPool:
    """A :class:`~concurrent.futures.ProcessPoolExecutor` of spawned processes that can be renewed.

    A worker that dies (killed, out of memory) breaks a process pool for good; ``run_many`` then
    calls :meth:`renew` and resubmits the runs that were in flight. At most ``workers`` runs are
    handed over at a time (``max_in_flight``), so a death costs only the runs then running.
    Spawned (not forked) processes start clean: no copied threads, locks or CUDA state.
    """

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidParameterError("workers", "an int >= 1", workers)
        self.workers = workers
        self.max_in_flight = workers
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` in a worker process."""
        return self._pool.submit(fn, *args)

    def renew(self) -> None:
        """Replace a broken pool by a fresh one."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._start()

    def shutdown(self) -> None:
        """Stop the workers (waits for running calls)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)``: the one remote function the Ray adapter submits."""
    return fn(*args)


class RayExecutor:
    """``submit()`` over Ray: each call is a Ray task; its ``ObjectRef.future()`` is returned.

    Args:
        address: the Ray cluster (``"auto"``, ``"ray://head:10001"``); None starts a local one
            unless Ray is already initialised in this process.
        num_cpus: CPUs each run reserves.
        num_gpus: GPUs each run reserves; a fraction (``0.25``) lets that many runs share a GPU.
        init_options: passed to ``ray.init`` when this adapter starts Ray.

    Ray's own task retries are off (``max_retries=0``): ``run_many`` retries failed runs, from
    the store, so each attempt is counted once.

    Raises:
        InvalidParameterError: ``num_cpus`` or ``num_gpus`` is negative.
        EngineMissingError: Ray is not installed (``pip install "dpcore[ray]"``).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        **init_options: Any,
    ) -> None:
        for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise InvalidParameterError(name, "a number >= 0", value)
        self._ray = _engine("ray", "ray", "ray")
        self._started = False
        if not self._ray.is_initialized():
            self._ray.init(address=address, **init_options)
            self._started = True
        self._remote = self._ray.remote(_call).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0
        )

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` as a Ray task; the returned future completes with its result."""
        future: Future[Any] = self._remote.remote(fn, *args).future()
        return future

    def shutdown(self) -> None:
        """Shut Ray down if this adapter started it."""
        if self._started:
            self._ray.shutdown()
            self._started = False


class _Requeueable:
    """``fn`` made checkpointable for submitit: a preempted or timed-out job is requeued as is.

    The runs resume from their store folder, so resubmitting the same call is the checkpoint.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def checkpoint(self, *args: Any) -> Any:
        helpers = _engine("slurm", "slurm", "submitit.helpers")
        return helpers.DelayedSubmission(self, *args)


class SubmititExecutor:
    """``submit()`` over submitit's ``AutoExecutor`` (Slurm; ``cluster="local"`` for tests).

    ``submit_many`` sends a whole batch as one Slurm job array (``map_array``). Jobs are
    requeued when Slurm preempts them or their time runs out (submitit's checkpointing): the
    runs resume from their folders in the store.

    Args:
        folder: where submitit keeps job pickles and logs (``%j`` is the job id).
        cluster: None (Slurm if available, else local), ``"slurm"``, ``"local"`` or ``"debug"``.
        parameters: passed to ``update_parameters`` (``timeout_min``, ``gpus_per_node``,
            ``slurm_partition``, ``slurm_array_parallelism``, ...).

    Raises:
        EngineMissingError: submitit is not installed (``pip install "dpcore[slurm]"``).
    """

    def __init__(
        self, folder: str | Path = ".dpcore-slurm/%j", cluster: str | None = None, **parameters: Any
    ) -> None:
        submitit = _engine("slurm", "slurm", "submitit")
        self.executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
        if parameters:
            self.executor.update_parameters(**parameters)

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """Submit ``fn(*args)`` as one job; returns the submitit job (``done()``, ``result()``)."""
        return self.executor.submit(_Requeueable(fn), *args)

    def submit_many(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """Submit ``fn(item)`` for each item as one job array; returns the jobs in order."""
        return list(self.executor.map_array(_Requeueable(fn), items))

    def shutdown(self) -> None:
        """Nothing to stop: jobs belong to the cluster (cancel them with ``scancel``)."""


@contextlib.contextmanager
def open_executor(executor: str | ExecutorChoice, **options: Any) -> Iterator[Any]:
    """The executor named by ``executor``, open for the block and closed after it.

    Yields None for ``local`` (run in this process). ``options`` go to the engine: for
    ``dask``, ``distributed.LocalCluster``'s (``n_workers``, ``threads_per_worker``,
    ``processes``) when no address is given; for ``ray``, :class:`RayExecutor`'s; for
    ``slurm``, :class:`SubmititExecutor`'s.

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice, or ``options`` are given
            for ``local`` or ``processes``.
        EngineMissingError: the engine is not installed.

    Example:
        >>> with open_executor("processes:2") as pool:
        ...     pool.submit(abs, -3).result()
        3
    """
    choice = executor if isinstance(executor, ExecutorChoice) else parse_executor(executor)
    if choice.kind in ("local", "processes") and options:
        raise InvalidParameterError("options", f"none for the {choice.kind!r} executor", options)
    if choice.kind == "local":
        yield None
    elif choice.kind == "processes":
        pool = SpawnPool(choice.workers or 1)
        try:
            yield pool
        finally:
            pool.shutdown()
    elif choice.kind == "dask":
        with _dask(choice.address, options) as dask_executor:
            yield dask_executor
    elif choice.kind == "ray":
        ray_executor = RayExecutor(choice.address, **options)
        try:
            yield ray_executor
        finally:
            ray_executor.shutdown()
    else:
        yield SubmititExecutor(**options)


@contextlib.contextmanager
def _dask(address: str | None, options: dict[str, Any]) -> Iterator[Any]:
    """A Dask client's ``concurrent.futures`` executor (``pure=False``: a retry really reruns)."""
    distributed = _engine("dask", "dask", "distributed")
    cluster = None
    if address is None:
        # a random dashboard port: the default 8787 may be taken (another cluster, a notebook)
        cluster = distributed.LocalCluster(**{"dashboard_address": ":0", **options})
        client = distributed.Client(cluster)
    elif options:
        raise InvalidParameterError("options", "none when a Dask address is given", options)
    else:
        client = distributed.Client(address)
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
