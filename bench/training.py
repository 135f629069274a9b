"""Step time and peak memory of DP training: non-private SGD, dpcore's DP-SGD, DP-SGD-JL, Opacus.

Two models, lot 256, random data of the right shape (timing does not depend on the values):

- ``mnist_cnn``: the TensorFlow Privacy MNIST CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`,
  26,010 parameters) on float32 ``(256, 1, 28, 28)`` images uniform in [0, 1), 10 classes;
- ``imdb_lstm``: the DP-SGD-JL paper's IMDb model (:func:`dpcore.torch.models.imdb_lstm`,
  ~587k parameters) on ``(256, 150)`` token ids below 8000, binary labels.

One *step* is a full optimizer step on the lot:

- ``nonprivate``: forward, mean loss, backward, SGD step. On ``imdb_lstm`` the reference is the
  model with ``nn.LSTM`` (``variant: "lstm"``, what users would run); a second row with
  ``variant: "dplstm"`` shows dpcore's clip-friendly LSTM without privacy.
- ``dpsgd_exact``: ``FastEngine.clipped_sum`` + ``DPOptimizer.step`` (sigma = 1, C = 1, expected
  lot 256); the ``dplstm`` variant on ``imdb_lstm``.
- ``dpsgd_vmap``: the same with ``VmapEngine``; on ``imdb_lstm`` with ``nn.LSTM`` (vmap over
  ``nn.LSTM`` needs float32 and oneDNN, which is left on).
- ``dpsgd_jl``: ``JLEngine`` with r in ``JL_DIMENSIONS``; on ``imdb_lstm`` with ``nn.LSTM``
  (faster than the DPLSTM variant; the engine turns oneDNN off only around its projections).
- ``opacus_<mode>`` for mode in hooks, functorch, ew, ghost: ``PrivacyEngine.make_private``
  (``poisson_sampling=False``, so the fixed lot is fed straight to the wrapped model) then
  forward, loss, backward, ``optimizer.step()``; on ``imdb_lstm`` the LSTM is Opacus'
  ``opacus.layers.DPLSTM`` (``variant: "opacus_dplstm"``). A mode that fails on a model is a row
  with ``"error"`` and null timings.

Every (model, method) cell runs in its own Python process (``python -m bench.training --worker``,
see :func:`bench.cells.run_timing`), so ``peak_rss_mb`` (``VmHWM``, see
:func:`dpcore.runs.workers.peak_rss_mb`) is that method's own peak; ``baseline_rss_mb`` is the same
counter just before the first step (interpreter, torch, model, data). Each process uses
``torch.set_num_threads(threads)`` (1 by default) and ``torch.set_flush_denormal(True)``: the
LSTM backward on CPU is ~3x slower on denormal floats, so every method gets the flag alike. Warm-up
steps are excluded; ``step_seconds`` is the median of the timed steps. ``ratio_to_nonprivate``
divides by the reference non-private row of the same model measured in the same run.

``quick`` (for ``nox -s bench -- training --quick``, under 5 minutes on 2 CPU cores) keeps the
models, the lot of 256 and every method, but (1) times at most 3 steps after 1 warm-up instead of
10 after 2, and fewer for slow methods: ``clamp(6 s // warm-up step time, 1, 3)`` steps (the
IMDb vmap, JL r = 10 and Opacus cells get 1 or 2; each row says ``timed_steps``), and (2) on
``imdb_lstm`` drops r = 30 from the JL dimensions (about a minute on its own there).

With ``device="cuda"`` models and data live on the GPU, the clock is read after
``torch.cuda.synchronize()``, and ``peak_gpu_mb`` is ``torch.cuda.max_memory_allocated``.

With ``--executor`` every cell (:class:`TimingRun`, :func:`measure`) is a run of
:func:`dpcore.runs.run_many` on a worker, handed one at a time
(:func:`dpcore.runs.one_at_a_time`): no two timings share a machine. Every row names the
machine that timed it (``hardware``, :func:`dpcore.runs.machine`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from bench.cells import (
    BATCH_SIZE,
    LEARNING_RATE,
    MAX_GRAD_NORM,
    NOISE_MULTIPLIER,
    OPACUS_MODES,
    run_timing,
    timing_worker,
)
from dpcore.runs import (
    ExecutorChoice,
    SupportsSubmit,
    machine,
    one_at_a_time,
    parse_executor,
    run_many,
)
from dpcore.runs.cells import Cell

__all__ = [
    "FULL",
    "GOALS",
    "JL_DIMENSIONS",
    "MODELS",
    "QUICK",
    "QUICK_JL_DIMENSIONS",
    "Profile",
    "cells",
    "check_device",
    "opacus_version",
    "run",
]

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("mnist_cnn", "imdb_lstm")
JL_DIMENSIONS = (1, 5, 10, 30)
QUICK_JL_DIMENSIONS = {"mnist_cnn": (1, 5, 10, 30), "imdb_lstm": (1, 5, 10)}


class Profile(TypedDict):
    """Steps and limits of one profile of the benchmark, per cell."""

    warmup: int
    steps: int
    budget: float | None
    timeout: float


FULL: Profile = {"warmup": 2, "steps": 10, "budget": None, "timeout": 1800}
QUICK: Profile = {"warmup": 1, "steps": 3, "budget": 6.0, "timeout": 300}
"""``budget``: seconds of timed steps per cell, estimated from the last warm-up step; at least
one step is timed, at most ``steps``. ``None``: always ``steps``."""
GOALS = {"dpsgd_exact": {"mnist_cnn": 1.5, "imdb_lstm": 2.0}}
"""Ratio goals (step time over non-private); DP-SGD-JL(r): at most ``1 + 0.5 r``."""


def cells(*, quick: bool, models: tuple[str, ...] = MODELS) -> list[Cell]:
    """Every cell of the benchmark, reference rows first."""
    result = []
    for model in models:
        lstm = model == "imdb_lstm"
        result.append(Cell(model, "nonprivate", "lstm" if lstm else None))
        if lstm:
            result.append(Cell(model, "nonprivate", "dplstm"))
        result.append(Cell(model, "dpsgd_exact", "dplstm" if lstm else None))
        result.append(Cell(model, "dpsgd_vmap", "lstm" if lstm else None))
        dimensions = QUICK_JL_DIMENSIONS[model] if quick else JL_DIMENSIONS
        for r in dimensions:
            result.append(Cell(model, "dpsgd_jl", "lstm" if lstm else None, r))
        for mode in OPACUS_MODES:
            result.append(Cell(model, f"opacus_{mode}", "opacus_dplstm" if lstm else None))
    return result


# ----------------------------------------------------------------------------- driver side


def _reference(rows: list[dict[str, Any]], model: str) -> float | None:
    variant = "lstm" if model == "imdb_lstm" else None
    for row in rows:
        if row["model"] == model and row["method"] == "nonprivate" and row["variant"] == variant:
            seconds: float | None = row["step_seconds"]
            return seconds
    return None


def _goal(row: dict[str, Any]) -> float | None:
    if row["method"] == "dpsgd_jl":
        return 1.0 + 0.5 * float(row["jl_dimension"])
    return GOALS.get(row["method"], {}).get(row["model"])


def check_device(device: str) -> None:
    """Raise unless ``device`` is ``"cpu"``, or ``"cuda"`` with a CUDA device visible to torch.

    Raises:
        ValueError: ``device`` is neither.
        RuntimeError: ``"cuda"`` on a machine where ``torch.cuda.is_available()`` is False.
    """
    import torch

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "--device cuda was asked for, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); run on a machine "
            "with an NVIDIA GPU and a CUDA build of torch (DPCORE_TORCH=cuda nox -s bench ...)."
        )


@dataclasses.dataclass(frozen=True)
class TimingRun:
    """One cell's timing, as a picklable spec for :func:`dpcore.runs.run_many` (:func:`measure`)."""

    cell: Cell
    device: str
    threads: int
    warmup: int
    steps: int
    budget: float | None
    timeout: float


def measure(run: TimingRun) -> dict[str, Any]:
    """Time ``run.cell`` in a fresh worker process (:func:`bench.cells.run_timing`): its row."""
    measured = run_timing(
        run.cell,
        device=run.device,
        threads=run.threads,
        warmup=run.warmup,
        steps=run.steps,
        budget=run.budget,
        timeout=run.timeout,
    )
    return {
        **dataclasses.asdict(run.cell),
        "batch_size": BATCH_SIZE,
        "step_seconds": None,
        "peak_rss_mb": None,
        "threads": run.threads,
        "device": run.device,
        "hardware": machine(),
        **measured,
    }


def run(
    results_dir: Path,
    *,
    quick: bool = False,
    device: str = "cpu",
    threads: int = 1,
    models: tuple[str, ...] = MODELS,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Measure every cell, write ``training.json`` (+ ``training.meta.json``), return the rows.

    Args:
        results_dir: where the JSON files go.
        quick: 1 warm-up + 3 timed steps per cell and r <= 10 on ``imdb_lstm`` (see module doc).
        device: ``"cpu"`` or ``"cuda"`` (the GPU profile).
        threads: torch intra-op threads in every worker.
        models: a subset of :data:`MODELS`.
        executor: None or ``"local"``: one cell after another from here, the results saved
            after every cell. Else a :func:`dpcore.runs.run_many` executor (``processes:N``,
            ``dask[:ADDRESS]``, ``ray[:ADDRESS]``, ``slurm``, or an object with ``submit()``)
            handed one cell at a time (:func:`dpcore.runs.one_at_a_time`: no two timings ever
            share a machine), saved when all are done; each row names the machine that timed
            it (``hardware``).

    Raises:
        RuntimeError: ``device="cuda"`` on a machine where torch sees no CUDA device.
        ValueError: an unknown device or model.
        InvalidParameterError: ``executor`` is not a valid choice.
    """
    from tqdm import tqdm

    check_device(device)
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; expected names in {MODELS}")
    if isinstance(executor, str):
        executor = parse_executor(executor)
    if isinstance(executor, ExecutorChoice) and executor.kind == "local":
        executor = None
    from dpcore.provenance import git_commit

    config = QUICK if quick else FULL
    commit = git_commit(ROOT)  # before the first save changes the tracked results
    started = time.perf_counter()
    todo = cells(quick=quick, models=models)
    runs = [
        TimingRun(cell, device, threads, config["warmup"], config["steps"], config["budget"],
                  config["timeout"])
        for cell in todo
    ]  # fmt: skip

    def save(rows: list[dict[str, Any]]) -> None:
        _save(
            results_dir, rows, commit=commit, quick=quick, device=device, threads=threads,
            models=models, wall_seconds=time.perf_counter() - started, cells_total=len(todo),
        )  # fmt: skip

    if executor is not None:
        with one_at_a_time(executor) as chosen:
            rows = run_many(measure, runs, executor=chosen)
        save(rows)
        return rows
    rows = []
    progress = tqdm(runs, desc="training benchmark", unit="cell")
    for timing in progress:
        progress.set_postfix_str(timing.cell.label)
        row = measure(timing)
        rows.append(row)
        seconds = row["step_seconds"]
        outcome = f"{seconds:.3f} s/step" if seconds is not None else f"error: {row['error']}"
        progress.write(f"{timing.cell.label}: {outcome}"[:300])
        # saved after every cell: a run stopped early (a time limit) keeps what it measured
        save(rows)
    return rows


def _save(
    results_dir: Path,
    rows: list[dict[str, Any]],
    *,
    commit: str,
    quick: bool,
    device: str,
    threads: int,
    models: tuple[str, ...],
    wall_seconds: float,
    cells_total: int,
) -> None:
    """Ratios and goals of the rows so far; ``training.json`` and ``training.meta.json``.

    ``cells_measured`` / ``cells_total`` in the meta say whether the run finished.
    """
    import torch

    from dpcore.provenance import provenance

    config = QUICK if quick else FULL
    for row in rows:
        reference = _reference(rows, row["model"])
        seconds = row["step_seconds"]
        ratio = None if reference is None or seconds is None else seconds / reference
        row["ratio_to_nonprivate"] = ratio
        goal = _goal(row)
        row["goal_ratio"] = goal
        row["goal_met"] = None if goal is None or ratio is None else ratio <= goal
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "training.json").write_text(json.dumps(rows, indent=2) + "\n")
    meta = provenance(
        root=ROOT,
        commit=commit,
        benchmark="training",
        torch=torch.__version__,
        opacus=opacus_version(),
        threads=threads,
        flush_denormal=True,
        quick=quick,
        device=device,
        device_name=torch.cuda.get_device_name() if device == "cuda" else None,
        date=datetime.date.today().isoformat(),
        wall_seconds=wall_seconds,
        cells_measured=len(rows),
        cells_total=cells_total,
        notes=[
            "torch.set_flush_denormal(True) in every worker, for every method alike: LSTM "
            "backward on CPU is ~3x slower on denormal floats without it.",
            "Each (model, method) cell runs in its own process; peak_rss_mb is its VmHWM.",
            "dpsgd_vmap on imdb_lstm uses nn.LSTM (vmap needs float32 and oneDNN on); dpsgd_jl "
            "uses nn.LSTM too (JLEngine turns oneDNN off only around its jvp projections).",
        ],
        config={
            "batch_size": BATCH_SIZE,
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "learning_rate": LEARNING_RATE,
            "warmup_steps": config["warmup"],
            "timed_steps": config["steps"],
            "timed_seconds_budget_per_cell": config["budget"],
            "statistic": "median",
            "jl_dimensions": {
                m: list(QUICK_JL_DIMENSIONS[m] if quick else JL_DIMENSIONS) for m in models
            },
            "opacus_modes": list(OPACUS_MODES),
            "reference": "nonprivate row (imdb_lstm: variant 'lstm', i.e. nn.LSTM)",
            "goals": "dpsgd_exact <= 1.5 (mnist_cnn), <= 2 (imdb_lstm); dpsgd_jl <= 1 + 0.5 r",
            "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        },
    )
    (results_dir / "training.meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def opacus_version() -> str | None:
    """The installed Opacus version (read without importing it), or None."""
    try:
        from importlib.metadata import version

        return version("opacus")
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(timing_worker(sys.argv[1:]))
