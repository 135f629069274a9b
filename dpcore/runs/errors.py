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
        shown = self.failures[:SHOWN_FAILURES]
        lines = [f"  {_short(repr(spec))}: {_described(error)}" for spec, error in shown]
        if len(self.failures) > len(shown):
            lines.append(f"  ... and {len(self.failures) - len(shown)} more (see .failures)")
        if any(type(error).__name__ == "BrokenProcessPool" for _, error in self.failures):
            lines.append(
                "  A worker process died: out of memory, a crash in native code, or a script "
                'that starts the runs without `if __name__ == "__main__":` (spawned workers '
                "import it again)."
            )
        joined = "\n".join(lines)
        super().__init__(
            f"{len(self.failures)} run(s) failed after {attempts} attempt(s) each; the other runs "
            f"finished and are stored:\n{joined}"
        )


#: Failures named in the message (all are kept in ``failures``).
SHOWN_FAILURES = 5
#: Characters of a spec's repr or an error's text shown in the message.
SHOWN_CHARACTERS = 300


def _short(text: str) -> str:
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "..."


def _described(error: BaseException) -> str:
    return _short(f"{type(error).__name__}: {error}")
