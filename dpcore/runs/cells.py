"""Measurement cells: one step of a model, timed or sized in a fresh worker process.

A *cell* (:class:`Cell`) names one measurement: a model, a method and its options. Its worker
(``python -m <module> --worker <cell JSON> ...``) builds the model and one optimizer step with
the study's ``build`` hook, measures it, and prints the row as the one result line of
:mod:`dpcore.runs.workers`; the parent starts it, reads the row and turns every other ending
(a crash, a timeout, a kill above a memory cap) into a row with an ``error``.

- worker side: :func:`measure_steps` (``warmup`` untimed steps, then the median of the timed
  ones) and :func:`measure_memory` (one warm-up and one timed step at a given lot), and the
  ``--worker`` command lines around them, :func:`timing_worker` and :func:`memory_worker`;
- parent side: :func:`run_cell` runs a cell in a fresh process and returns its typed
  :class:`~dpcore.runs.workers.WorkerResult`; :func:`run_timing` and :func:`run_capped` turn it
  into the result rows of a timing and of a memory study.

Benchmarks and reproductions share these, and the lots and steps of dpcore's training methods
that a ``build`` hook is made of (:mod:`dpcore.runs.torch_cells`). torch is imported only inside
the functions that need it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dpcore.runs.workers import POLL_SECONDS, WorkerResult, emit_result, peak_rss_mb, run_worker

__all__ = [
    "MEMORY_WARMUP_LIMIT_SECONDS",
    "Cell",
    "MemoryBuild",
    "TimingBuild",
    "measure_memory",
    "measure_steps",
    "memory_worker",
    "run_capped",
    "run_cell",
    "run_timing",
    "timed_count",
    "timing_worker",
    "worker_command",
    "worker_parser",
    "worker_settings",
]

#: :func:`measure_memory` skips the timed step after a warm-up (first) step longer than this:
#: an engine's first lot runs one-time checks (dpcore's fast path: a reference backward and an
#: eval-mode pass comparing three examples' norms), so it may take longer than a step.
MEMORY_WARMUP_LIMIT_SECONDS = 180.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """One measurement: a model (``mnist_cnn``, ``imdb_lstm``), a method and its options.

    ``method`` names what the study's ``build`` hook builds (the training benchmark's:
    ``nonprivate``, ``dpsgd_exact``, ``dpsgd_vmap``, ``dpsgd_jl``, ``opacus_<mode>``);
    ``variant`` picks a form of the model (e.g. ``"lstm"`` or ``"dplstm"``); ``jl_dimension`` is
    the r of DP-SGD-JL.

    Example:
        >>> cell = Cell("imdb_lstm", "dpsgd_jl", "lstm", 5)
        >>> cell.label, Cell.from_json(cell.to_json()) == cell
        ('imdb_lstm dpsgd_jl lstm r=5', True)
    """

    model: str
    method: str
    variant: str | None = None
    jl_dimension: int | None = None

    @property
    def label(self) -> str:
        """``model method [variant] [r=...]``, for progress lines."""
        parts = [self.model, self.method]
        if self.variant is not None:
            parts.append(self.variant)
        if self.jl_dimension is not None:
            parts.append(f"r={self.jl_dimension}")
        return " ".join(parts)

    def to_json(self) -> str:
        """The cell as a JSON object (how it is passed to a worker)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Cell:
        """The cell of :meth:`to_json`'s text."""
        return cls(**json.loads(text))


#: ``build(cell, device)`` -> ``(model, step)``: a timing study's own model and step.
TimingBuild = Callable[[Cell, Any], tuple[Any, Callable[[], None]]]
#: ``build(cell, batch_size, device)`` -> ``(model, step)``: a memory study's own model and step.
MemoryBuild = Callable[[Cell, int, str], tuple[Any, Callable[[], None]]]


# ----------------------------------------------------------------------------- worker side


@contextlib.contextmanager
def worker_settings(threads: int) -> Iterator[bool]:
    """torch threads and flush-to-zero of denormal floats for a measurement, restored after.

    Flush-to-zero is a CPU flag: left on, it would change every later float computation of the
    process (numpy's included). Yields whether the CPU supports it.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    flush = bool(torch.set_flush_denormal(True))
    try:
        yield flush
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(previous)


def _timed(step: Callable[[], object], cuda: bool) -> float:
    """Seconds one call of ``step`` takes (the GPU synchronised before the clock stops)."""
    import torch

    start = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def timed_count(
    warmup_seconds: Sequence[float],
    steps: int,
    budget: float | None,
    min_seconds: float | None = None,
    most: int = 2000,
) -> int:
    """How many steps to time: ``steps``, or with a ``budget`` (seconds) ``clamp(budget // last
    warm-up step, 1, steps)`` (so a slow method costs a bounded time; ``steps`` without a
    warm-up step). With ``min_seconds``, fast steps are timed for about that long instead
    (``min_seconds // last warm-up step``, at most ``most``), so that a median of
    millisecond steps rests on enough of them.

    Example:
        >>> timed_count([9.0, 2.5], 3, 6.0), timed_count([0.1], 3, 6.0), timed_count([], 3, 6.0)
        (2, 3, 3)
        >>> timed_count([50.0], 10, 6.0), timed_count([50.0], 10, None)
        (1, 10)
        >>> timed_count([0.25], 10, None, min_seconds=5.0), timed_count([6.0], 10, None, 5.0)
        (20, 10)
    """
    if budget is None or not warmup_seconds:
        count = steps
    else:
        count = max(1, min(steps, int(budget // max(warmup_seconds[-1], 1e-9))))
    if min_seconds is not None and warmup_seconds:
        count = max(count, min(most, int(min_seconds // max(warmup_seconds[-1], 1e-9))))
    return count


def measure_steps(
    cell: Cell,
    *,
    device: str,
    threads: int,
    warmup: int,
    steps: int,
    budget: float | None = None,
    build: TimingBuild,
) -> dict[str, Any]:
    """Time ``cell`` in this process: ``warmup`` untimed steps, then the median of ``steps``.

    With a ``budget`` (seconds), only ``clamp(budget // last warm-up step, 1, steps)`` steps are
    timed, so a slow method costs a bounded time in the quick profile. ``build(cell, device)``
    returns ``(model, step)``: the study's model (its trainable parameters are counted) and
    one full optimizer step. An exception is recorded in the row's ``error``, not raised.
    """
    import torch

    with worker_settings(threads) as flush:
        return _measure_steps(cell, torch.device(device), flush, warmup, steps, budget, build)


def _measure_steps(
    cell: Cell,
    where: Any,
    flush: bool,
    warmup: int,
    steps: int,
    budget: float | None,
    build: TimingBuild,
) -> dict[str, Any]:
    import torch

    cuda = where.type == "cuda"
    row: dict[str, Any] = {
        "step_seconds": None,
        "step_seconds_all": None,
        "baseline_rss_mb": None,
        "peak_rss_mb": None,
        "peak_gpu_mb": None,
        "timed_steps": None,
        "warmup_seconds": None,
        "parameters": None,
        "flush_denormal": bool(flush),
        "error": None,
    }
    try:
        model, step = build(cell, where)
        row["parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        row["baseline_rss_mb"] = peak_rss_mb()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warm = []
            for _ in range(warmup):
                warm.append(_timed(step, cuda))
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            count = timed_count(warm, steps, budget)
            row["warmup_seconds"] = warm
            row["timed_steps"] = count
            times = []
            for _ in range(count):
                times.append(_timed(step, cuda))
        row["step_seconds"] = statistics.median(times)
        row["step_seconds_all"] = times
        if cuda:
            row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as error:  # recorded, not raised: one failing method must not stop the run
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
        row["step_seconds"] = row["step_seconds_all"] = None
    row["peak_rss_mb"] = peak_rss_mb()
    return row


def measure_memory(
    cell: Cell,
    batch_size: int,
    *,
    threads: int = 1,
    build: MemoryBuild,
    device: str = "cpu",
) -> dict[str, Any]:
    """One warm-up step then one timed step of ``cell`` on a lot of ``batch_size``, here.

    ``build(cell, batch_size, device)`` returns ``(model, step)``: the study's model and one
    full optimizer step on a lot of ``batch_size``. The timed step is skipped
    (``skipped: "too slow"``) after a warm-up longer than :data:`MEMORY_WARMUP_LIMIT_SECONDS`.
    With ``device="cuda"`` the model and lot live on the GPU and ``peak_gpu_mb`` is
    ``torch.cuda.max_memory_allocated`` (None on CPU). An exception (out-of-memory included)
    is recorded in ``error``, not raised.
    """
    with worker_settings(threads):
        return _measure_memory(cell, batch_size, build, device)


def _measure_memory(cell: Cell, batch_size: int, build: MemoryBuild, device: str) -> dict[str, Any]:
    import torch

    cuda = device == "cuda"
    row: dict[str, Any] = {
        "step_seconds": None,
        "warmup_seconds": None,
        "baseline_rss_mb": None,
        "peak_rss_mb": None,
        "peak_gpu_mb": None,
        "skipped": None,
        "error": None,
    }
    try:
        _, step = build(cell, batch_size, device)
        row["baseline_rss_mb"] = peak_rss_mb()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row["warmup_seconds"] = _timed(step, cuda)
            if row["warmup_seconds"] > MEMORY_WARMUP_LIMIT_SECONDS:
                row["skipped"] = "too slow"
            else:
                row["step_seconds"] = _timed(step, cuda)
    except (Exception, MemoryError) as error:  # recorded: the parent decides what it means
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
    row["peak_rss_mb"] = peak_rss_mb()
    if cuda:
        row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def worker_parser(module: str) -> argparse.ArgumentParser:
    """The options every worker takes: the cell (``--worker``), ``--device``, ``--threads``."""
    parser = argparse.ArgumentParser(prog=f"python -m {module} --worker")
    parser.add_argument("--worker", required=True, help="the cell, as JSON")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def timing_worker(argv: Sequence[str], *, build: TimingBuild, module: str) -> int:
    """``python -m <module> --worker CELL --warmup N --steps N [--budget S] [--device D]
    [--threads N]``: :func:`measure_steps` here, then its row as the one result line.

    ``module`` (whose ``__main__`` calls this, with its ``build`` hook) names the program in
    usage messages. Returns the exit status (0).
    """
    parser = worker_parser(module)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--budget", type=float, default=None)
    args = parser.parse_args(list(argv))
    row = measure_steps(
        Cell.from_json(args.worker),
        device=args.device,
        threads=args.threads,
        warmup=args.warmup,
        steps=args.steps,
        budget=args.budget,
        build=build,
    )
    emit_result(row)
    return 0


def memory_worker(
    argv: Sequence[str],
    *,
    build: MemoryBuild,
    module: str,
) -> int:
    """``python -m <module> --worker CELL --batch-size N [--device D] [--threads N]``:
    :func:`measure_memory` here, then its row as the one result line (exit status 0)."""
    parser = worker_parser(module)
    parser.add_argument("--batch-size", type=int, required=True)
    args = parser.parse_args(list(argv))
    row = measure_memory(
        Cell.from_json(args.worker),
        args.batch_size,
        threads=args.threads,
        build=build,
        device=args.device,
    )
    emit_result(row)
    return 0


def worker_command(cell: Cell, module: str, **options: Any) -> list[str]:
    """``python -m <module> --worker <cell JSON> --<option>=<value> ...`` (None: left out).

    Example:
        >>> worker_command(Cell("mnist_cnn", "nonprivate"), "study.timing", batch_size=8,
        ...                budget=None)[2:]  # doctest: +NORMALIZE_WHITESPACE
        ['study.timing', '--worker',
         '{"model": "mnist_cnn", "method": "nonprivate", "variant": null, "jl_dimension": null}',
         '--batch-size=8']
    """
    flags = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in options.items()
        if value is not None
    ]
    return [sys.executable, "-m", module, "--worker", cell.to_json(), *flags]


def run_cell(
    cell: Cell,
    *,
    module: str,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    cap_mb: float | None = None,
    poll_seconds: float = POLL_SECONDS,
    **options: Any,
) -> WorkerResult:
    """Run ``cell`` in a fresh worker process (``python -m <module> --worker ...`` in ``cwd``,
    default this process's working folder, ``options`` as its flags); what became of it.

    ``module``'s ``__main__`` must call :func:`timing_worker` or :func:`memory_worker` (or
    another worker that prints one result line). ``cap_mb`` and ``timeout`` are enforced as in
    :func:`dpcore.runs.workers.run_worker`; nothing the worker does raises here.
    """
    return run_worker(
        worker_command(cell, module, **options),
        cwd=cwd,
        timeout=timeout,
        cap_mb=cap_mb,
        poll_seconds=poll_seconds,
    )


def run_timing(
    cell: Cell,
    *,
    device: str,
    threads: int,
    warmup: int,
    steps: int,
    budget: float | None,
    timeout: float,
    module: str,
    cwd: str | Path | None = None,
) -> dict[str, Any]:
    """:func:`measure_steps` of ``cell`` in a fresh worker of ``module``: its result row.

    A worker that fails without a row gives ``{"error": ...}`` alone: ``"timed out after T s"``
    or ``"worker exited with status N: <end of its output>"``.
    """
    result = run_cell(
        cell,
        module=module,
        cwd=cwd,
        timeout=timeout,
        device=device,
        threads=threads,
        warmup=warmup,
        steps=steps,
        budget=budget,
    )
    if result.ok:
        return dict(result.row or {})
    return {"error": result.error}


def run_capped(
    cell: Cell,
    batch_size: int,
    *,
    cap_mb: float,
    timeout: float,
    module: str,
    cwd: str | Path | None = None,
    threads: int = 1,
    device: str = "cpu",
    poll_seconds: float = POLL_SECONDS,
) -> dict[str, Any]:
    """:func:`measure_memory` of ``cell`` at ``batch_size`` in a fresh worker of ``module``,
    killed if its resident set passes ``cap_mb`` or it outlives ``timeout``: its result row.

    The row always has ``polled_rss_mb`` (the largest ``VmRSS`` the parent read) and
    ``exceeded_cap``. Killed above the cap, or a worker whose own peak (``VmHWM``) ended above
    it (a spike between two polls): ``exceeded_cap: true`` and ``peak_rss_mb: null``. Killed
    for time: ``skipped: "too slow"`` and ``error: "killed after T s"``. Exited without a
    row: ``error: "worker exited with status N: ..."`` (see
    :func:`dpcore.runs.workers.is_oom`).
    """
    result = run_cell(
        cell,
        module=module,
        cwd=cwd,
        timeout=timeout,
        cap_mb=cap_mb,
        poll_seconds=poll_seconds,
        batch_size=batch_size,
        threads=threads,
        device=device,
    )
    row: dict[str, Any] = {"polled_rss_mb": result.polled_rss_mb, "exceeded_cap": False}
    if result.status == "over_cap":
        return {**row, "exceeded_cap": True, "peak_rss_mb": None, "step_seconds": None}
    if result.status == "timeout":
        return {**row, "skipped": "too slow", "error": f"killed after {timeout:.0f} s"}
    if not result.ok:
        return {**row, "error": result.error}
    row.update(result.row or {})
    if row.get("peak_rss_mb") is not None and row["peak_rss_mb"] > cap_mb:
        row["exceeded_cap"] = True  # a spike between two polls
        row["peak_rss_mb"] = None
    return row
