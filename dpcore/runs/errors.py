"""Typed errors of the run layer: a missing engine, a run not in the store, runs that failed."""

from __future__ import annotations

from collections.abc import Sequence

from dpcore.errors import DPCoreError

__all__ = ["EngineMissingError", "RunNotFoundError", "RunsFailedError"]


class EngineMissingError(DPCoreError, ImportError):
    """An executor was asked for whose engine (Dask, Ray, submitit) is not installed.

    The message names the extra that installs it.

    Example:
        >>> raise EngineMissingError("dask", "dask")
        Traceback (most recent call last):
        ...
        dpcore.runs.errors.EngineMissingError: The 'dask' executor needs the package 'dask', \
which is not installed: pip install "dpcore[dask]".
    """

    def __init__(self, executor: str, extra: str, package: str | None = None) -> None:
        self.executor = executor
        self.extra = extra
        package = package or extra
        super().__init__(
            f"The {executor!r} executor needs the package {package!r}, which is not installed: "
            f'pip install "dpcore[{extra}]".'
        )


class RunNotFoundError(DPCoreError, LookupError):
    """The store holds no finished result for the spec asked for."""

    def __init__(self, spec: object, folder: object) -> None:
        self.spec = spec
        self.folder = folder
        super().__init__(f"No finished result for {spec!r} in {folder}.")


class RunsFailedError(DPCoreError, RuntimeError):
    """Some runs still failed after their retries; every other run finished and is stored.

    Attributes:
        failures: ``(spec, error)`` pairs, in the order of the specs given, with the error the
            last attempt raised (a worker that died shows as the executor's error).
    """

    def __init__(self, failures: Sequence[tuple[object, BaseException]], attempts: int) -> None:
        self.failures = list(failures)
        self.attempts = attempts
        lines = "\n".join(
            f"  {spec!r}: {type(error).__name__}: {error}" for spec, error in self.failures
        )
        super().__init__(
            f"{len(self.failures)} run(s) failed after {attempts} attempt(s) each; the other runs "
            f"finished and are stored:\n{lines}"
        )
