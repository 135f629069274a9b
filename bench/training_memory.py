"""The largest lot that fits in a memory cap, per DP training method (host RSS, CPU).

Goal (from the issue): "the largest lot that fits in 8 GiB within 2x of non-private for the fast
exact path and for JL" -- the DP-SGD-JL paper's Table 3 claim, on the TensorFlow Privacy MNIST
CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`).

Methods (the step builders of :mod:`bench.cells`, with the lot size passed through):
``nonprivate``, ``dpsgd_exact`` (``FastEngine``), ``dpsgd_vmap`` (``VmapEngine``), ``dpsgd_jl``
with r = 10 (``JLEngine``) and ``opacus_hooks``.

For each method, lots ``2**k`` for k = 10, 11, ... run one at a time, each in a fresh process
(``python -m bench.training_memory --worker``, :func:`bench.cells.run_capped`) doing 1 warm-up
step and 1 timed step on random data of the right shape. The parent polls the worker's resident
set (``VmRSS`` in ``/proc/<pid>/status``) every 50 ms and kills it (SIGKILL) as soon as it passes
the cap (8192 MiB): ``RLIMIT_AS`` is not used, since torch reserves far more virtual memory than
it touches. A lot whose worker was killed, or whose own peak (``VmHWM``) ended above the cap (a
spike between two polls), is ``exceeded_cap: true`` with ``peak_rss_mb: null``; otherwise
``peak_rss_mb`` is the worker's ``VmHWM`` after both steps (it includes the interpreter, torch
and the data, ~0.3 GiB at small lots) and ``polled_rss_mb`` the largest ``VmRSS`` the parent saw.

A method's sweep stops at the first lot that exceeds the cap, fails (an out-of-memory error or any
other), is too slow, or after ``2**17``. *Too slow*: a step over 60 s -- the worker skips the
timed step when its warm-up (first) step took over 180 s (a first step may run one-time checks),
and the parent does not start a lot whose step, predicted as twice the previous lot's, would take
longer; either way the row is ``"skipped": "too slow"``
and that method's ``largest_lot_under_cap`` is then only a lower bound (``stopped_by`` says
why each sweep ended). Workers use 1 torch thread, like :mod:`bench.training`.

Output: ``training_memory.json`` (one row per lot tried) and ``training_memory.meta.json``
(provenance, the cap, and one summary per method with ``largest_lot_under_cap`` and its ratio to
non-private's). ``quick`` stops every sweep at ``2**12`` (a smoke test, not the answer).

With an ``executor`` (``python -m bench training_memory --executor processes:2``), the methods'
sweeps run at once through :func:`dpcore.runs.run_many` (:class:`MethodSweep`,
:func:`sweep_method`), each still one lot after another in fresh workers with their own cap
(host RSS is per process); the rows and summaries are those of the in-process run, in the same
order. The logical-lot sweep stays in this process.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import cells, logical_lots, training
from dpcore.runs import ExecutorChoice, SupportsSubmit, parse_executor, run_many, workers
from dpcore.runs import cells as runs_cells
from dpcore.runs.cells import Cell

ROOT = Path(__file__).resolve().parents[1]
MODEL = "mnist_cnn"
CAP_MB = 8192.0
POLL_SECONDS = workers.POLL_SECONDS
MIN_LOG2 = 10
MAX_LOG2 = 17
QUICK_MAX_LOG2 = 12
SLOW_SECONDS = 60.0
#: The warm-up (first) step may take longer (3 * SLOW_SECONDS): an engine's first lot runs
#: one-time checks (see :data:`dpcore.runs.cells.MEMORY_WARMUP_LIMIT_SECONDS`).
WARMUP_SECONDS = runs_cells.MEMORY_WARMUP_LIMIT_SECONDS
WORKER_TIMEOUT = 400.0
JL_DIMENSION = 10
METHODS = (
    Cell(MODEL, "nonprivate"),
    Cell(MODEL, "dpsgd_exact"),
    Cell(MODEL, "dpsgd_vmap"),
    Cell(MODEL, "dpsgd_jl", jl_dimension=JL_DIMENSION),
    Cell(MODEL, "opacus_hooks"),
)


# ----------------------------------------------------------------------------- driver side


def sweep(
    cell: Cell,
    *,
    max_log2: int,
    cap_mb: float,
    threads: int,
    progress: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows for lots ``2**MIN_LOG2 .. 2**max_log2`` of ``cell``, and the method's summary."""
    rows: list[dict[str, Any]] = []
    largest: int | None = None
    stopped_by = f"reached the largest lot tried, 2**{max_log2}"
    previous: float | None = None
    done = 0
    for k in range(MIN_LOG2, max_log2 + 1):
        lot = 2**k
        progress.set_postfix_str(f"{cell.method} lot {lot}")
        base = {
            "model": cell.model,
            "method": cell.method,
            "jl_dimension": cell.jl_dimension,
            "batch_size": lot,
        }
        if previous is not None and 2 * previous > SLOW_SECONDS:
            predicted = 2 * previous
            rows.append(
                {
                    **base,
                    "peak_rss_mb": None,
                    "exceeded_cap": False,
                    "step_seconds": None,
                    "skipped": "too slow",
                    "predicted_step_seconds": predicted,
                }
            )
            stopped_by = f"too slow: predicted {predicted:.0f} s per step at lot {lot}"
            progress.write(f"{cell.label} lot {lot}: skipped, predicted {predicted:.0f} s/step")
            break
        measured = cells.run_capped(
            cell, lot, cap_mb=cap_mb, timeout=WORKER_TIMEOUT, threads=threads
        )
        row = {
            **base,
            "peak_rss_mb": None,
            "exceeded_cap": False,
            "step_seconds": None,
            "skipped": None,
            "error": None,
            **measured,
        }
        rows.append(row)
        progress.update(1)
        done += 1
        if row["exceeded_cap"]:
            stopped_by = f"exceeded the cap at lot {lot}"
            progress.write(f"{cell.label} lot {lot}: exceeded {cap_mb:.0f} MiB")
            break
        if row["error"] is not None and row.get("skipped") is None:
            stopped_by = ("out of memory" if workers.is_oom(row) else "error") + f" at lot {lot}"
            progress.write(f"{cell.label} lot {lot}: {row['error']}"[:300])
            break
        if row.get("skipped") is not None:
            stopped_by = f"too slow at lot {lot} (warm-up step over {WARMUP_SECONDS:.0f} s)"
            progress.write(f"{cell.label} lot {lot}: skipped, too slow")
            break
        largest = lot
        previous = row["step_seconds"]
        progress.write(
            f"{cell.label} lot {lot}: {row['peak_rss_mb']:.0f} MiB, {row['step_seconds']:.2f} s"
        )
    progress.update(max_log2 - MIN_LOG2 + 1 - done)  # the lots this sweep did not need
    summary = {
        "method": cell.method,
        "jl_dimension": cell.jl_dimension,
        "largest_lot_under_cap": largest,
        "stopped_by": stopped_by,
        "lower_bound_only": not (stopped_by.startswith(("exceeded", "out of memory"))),
    }
    return rows, summary


@dataclasses.dataclass(frozen=True)
class MethodSweep:
    """One method's sweep, as a picklable spec for :func:`dpcore.runs.run_many`."""

    cell: Cell
    max_log2: int
    cap_mb: float
    threads: int


class _Silent:
    """The progress bar of a sweep run by a worker: it reports nothing."""

    def set_postfix_str(self, text: str) -> None:
        """Ignore the lot being measured."""

    def update(self, count: int = 1) -> None:
        """Ignore the lots done."""

    def write(self, text: str) -> None:
        """Ignore the outcome of a lot."""


def sweep_method(spec: MethodSweep) -> dict[str, Any]:
    """:func:`sweep` of ``spec`` (where a worker runs it): ``{"rows": [...], "summary": {...}}``."""
    rows, summary = sweep(
        spec.cell,
        max_log2=spec.max_log2,
        cap_mb=spec.cap_mb,
        threads=spec.threads,
        progress=_Silent(),
    )
    return {"rows": rows, "summary": summary}


def run(
    results_dir: Path,
    *,
    quick: bool = False,
    cap_mb: float = CAP_MB,
    threads: int = 1,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Sweep every method, write ``training_memory.json`` (+ ``.meta.json``), return the rows.

    Args:
        results_dir: where the JSON files go.
        quick: stop every sweep at ``2**12``.
        cap_mb: the memory cap (host RSS, MiB).
        threads: torch intra-op threads in every worker.
        executor: None or ``"local"``: one method after another from here. Else a
            :func:`dpcore.runs.run_many` executor that runs the methods' sweeps at once.

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice.
    """
    import torch
    from tqdm import tqdm

    from dpcore.provenance import provenance

    if isinstance(executor, str):
        executor = parse_executor(executor)
    if isinstance(executor, ExecutorChoice) and executor.kind == "local":
        executor = None
    max_log2 = QUICK_MAX_LOG2 if quick else MAX_LOG2
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    per_method = max_log2 - MIN_LOG2 + 1
    logical_count = 1 if quick else logical_lots.MAX_LOG2 - logical_lots.MIN_LOG2 + 1
    total = len(METHODS) * per_method + logical_count
    with tqdm(total=total, desc="training memory", unit="lot") as progress:
        if executor is not None:
            specs = [MethodSweep(cell, max_log2, cap_mb, threads) for cell in METHODS]
            for swept in run_many(sweep_method, specs, executor=executor):
                rows.extend(swept["rows"])
                summaries.append(swept["summary"])
            progress.update(len(METHODS) * per_method)
        for cell in [] if executor is not None else METHODS:
            method_rows, summary = sweep(
                cell, max_log2=max_log2, cap_mb=cap_mb, threads=threads, progress=progress
            )
            rows.extend(method_rows)
            summaries.append(summary)
        logical_rows, logical = logical_lots.sweep(quick=quick, cap_mb=cap_mb, progress=progress)
        rows.extend(logical_rows)
    reference = next(s["largest_lot_under_cap"] for s in summaries if s["method"] == "nonprivate")
    for summary in summaries:
        lot = summary["largest_lot_under_cap"]
        summary["ratio_to_nonprivate"] = None if not lot or not reference else lot / reference
        summary["within_2x_of_nonprivate"] = (
            None
            if summary["ratio_to_nonprivate"] is None
            else summary["ratio_to_nonprivate"] >= 0.5
        )
    meta = provenance(  # before the rows file: its commit must not see that file changed
        root=ROOT,
        benchmark="training_memory",
        torch=torch.__version__,
        opacus=training.opacus_version(),
        model=MODEL,
        cap_mb=cap_mb,
        threads=threads,
        quick=quick,
        date=datetime.date.today().isoformat(),
        wall_seconds=time.perf_counter() - started,
        summaries=summaries,
        logical_lots=logical,
        config={
            "lots": [2**k for k in range(MIN_LOG2, max_log2 + 1)],
            "warmup_steps": 1,
            "timed_steps": 1,
            "poll_seconds": POLL_SECONDS,
            "slow_step_seconds": SLOW_SECONDS,
            "slow_warmup_seconds": WARMUP_SECONDS,
            "noise_multiplier": cells.NOISE_MULTIPLIER,
            "max_grad_norm": cells.MAX_GRAD_NORM,
            "jl_dimension": JL_DIMENSION,
        },
        notes=[
            "Memory is host RSS on CPU: the parent polls VmRSS every 50 ms and kills a worker "
            "above the cap; peak_rss_mb is the worker's VmHWM (includes ~0.3 GiB of "
            "interpreter, torch and data at small lots).",
            "largest_lot_under_cap is a power of two; with lower_bound_only the sweep ended for "
            "time (or the largest lot tried), not memory.",
            "dpsgd_exact_virtual rows (bench.logical_lots): one logical lot of logical_lot "
            "examples in micro-batches of physical_batch_size, from a dataset that makes each "
            "example on the fly; largest_logical_lot is the largest that stayed under the cap.",
        ],
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "training_memory.json").write_text(json.dumps(rows, indent=2) + "\n")
    (results_dir / "training_memory.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(cells.memory_worker(sys.argv[1:]))
