"""A reproduction's ``executor`` option: where its independent runs train, and how to say so.

Every reproduction that fans out takes ``executor`` (``--executor``): None or ``"local"`` trains
its runs here, one after another; any other :func:`dpcore.runs.run_many` executor
(``"processes:N"``, ``"dask[:ADDRESS]"``, ``"ray[:ADDRESS]"``, ``"slurm"``, or an object with
``submit()``) trains them at once, each into the run store, from which the reproduction then
reads them back. :func:`fanning_out` reads the option once (an invalid one is refused before
anything runs) and :func:`spread` describes it for the saved results.
"""

from __future__ import annotations

from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, RunStore, SupportsSubmit, parse_executor
from reproductions.harness.output import Output

__all__ = ["Executor", "fanned_store", "fanning_out", "spread"]

#: What a reproduction's ``executor`` parameter accepts.
Executor = str | ExecutorChoice | SupportsSubmit | None


def fanning_out(executor: Executor) -> ExecutorChoice | SupportsSubmit | None:
    """The executor to fan the runs out on, or None to train them here one after another.

    Raises:
        InvalidParameterError: ``executor`` is a string that is not a valid choice, or neither
            None, a string, an :class:`~dpcore.runs.ExecutorChoice` nor an object with
            ``submit()``.

    Example:
        >>> fanning_out(None) is None and fanning_out("local") is None
        True
        >>> fanning_out("processes:2")
        ExecutorChoice(kind='processes', workers=2, address=None)
    """
    if executor is None:
        return None
    if isinstance(executor, str):
        executor = parse_executor(executor)
    if isinstance(executor, ExecutorChoice):
        return None if executor.kind == "local" else executor
    if not callable(getattr(executor, "submit", None)):
        raise InvalidParameterError(
            "executor", "None, a string or an object with submit()", executor
        )
    return executor


def fanned_store(
    fanned: ExecutorChoice | SupportsSubmit | None, output: Output, stem: str, *modules: str
) -> RunStore | None:
    """The run store of a fanned-out reproduction (``<runs>/<stem>``, keyed by the code of
    ``modules``), or None when its runs train here, one after another, unstored."""
    if fanned is None:
        return None
    return RunStore(output.store(stem), code=output.code(*modules))


def spread(executor: Executor) -> str:
    """How the runs were spread, for the saved results.

    Raises:
        InvalidParameterError: as :func:`fanning_out`.

    Example:
        >>> spread(None), spread("processes:2"), spread("dask:tcp://10.0.0.1:8786")
        ('one run after another, in this process', '2 runs at once', 'fanned out on dask')
    """
    chosen = fanning_out(executor)
    if chosen is None:
        return "one run after another, in this process"
    if not isinstance(chosen, ExecutorChoice):
        return f"fanned out on {type(chosen).__name__}"
    if chosen.kind == "processes":
        workers = chosen.workers
        if workers is None:
            return "one run per CPU at once"
        return f"{workers} run{'s' if workers > 1 else ''} at once"
    return f"fanned out on {chosen.kind}"
