"""Bu et al. 2021, Table 2: seconds per IMDb epoch, non-private Adam vs DP-Adam vs DP-Adam-JL.

Model: the paper's IMDb LSTM (:func:`dpcore.torch.models.imdb_lstm`, §5) on the real tokenised
reviews (:func:`dpcore.data.text.imdb_sequences`: 25,000 training reviews, vocabulary 8,000,
length 150). One epoch is ``round(n / L) = 98`` lots of expected size L = 256.

Methods (every one a full optimizer step on a lot of real reviews):

- ``nonprivate``: ``nn.LSTM`` model, Adam on shuffled lots of exactly 256, mean logistic loss;
- ``dp_adam_exact``: our fastest exact per-example path, the ``DPLSTM`` model with
  ``DPTrainer.dp_adam(engine="fast")`` on Poisson lots;
- ``dp_adam_jl`` (r in 1, 5, 10, 30): the ``nn.LSTM`` model with ``DPTrainer.dp_adam(engine="jl")``.

Timing reuses the measuring cells of :mod:`dpcore.runs.cells` (as the training benchmark
does): every method runs in its own process (``python -m reproductions.bu2021_jl.speed
--worker``) with flush-to-zero for denormals, warm-up lots are not timed, and at most
``timed_lots`` lots after them are (fewer for slow methods in the quick profile, by a time
budget). A row's ``seconds_per_epoch`` is a partial epoch
extrapolated: the mean of its timed lots times 98 (``extrapolated: true``, ``timed_steps`` lots).

The full profile keeps each method's measurement in its :class:`Output`'s run store
(``reproductions/checkpoints/`` by default) so that a run cut off part-way resumes; each is keyed
by everything that determines it (:func:`measurement_key`: the method, the whole profile, device,
threads, hardware, torch version and a fingerprint of the measuring code), and one stored under
another key is ignored.

The paper's Table 2 was measured with TensorFlow on a P100; its vanilla DP-Adam was TF Privacy's.
When ``figures/bu2021_jl_tf_privacy.json`` exists (``nox -s tfprivacy``, TF Privacy's vanilla
optimizer on the same model, timed on our hardware), its rows are shown next to ours; so are
those of ``figures/bu2021_jl_dpcore_tf.json`` (``nox -s dpcoretf``: dpcore's TensorFlow backend,
exact and JL DP-Adam, against Keras 3's non-private Adam on the same lots).
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.atomic import atomic_write_bytes
from dpcore.runs import measurements as cache
from dpcore.runs import one_at_a_time, run_many
from dpcore.runs.cells import Cell, run_timing, timing_worker
from reproductions.bu2021_jl import config as paper
from reproductions.common import code_fingerprint, profile_config
from reproductions.harness import ROOT, Executor, Output, fanning_out

STEM = "bu2021_jl_speed"
TABLE = "speed-table"
MODULE = "reproductions.bu2021_jl.speed"
#: The tokenised training reviews, shared by the driver and its worker processes (which are
#: given no :class:`Output`): always in the default run store.
DATA_CACHE = Output().store(STEM) / "imdb_train_ids.npz"
#: Results stem of :mod:`~reproductions.bu2021_jl.tf_privacy_baseline` (``nox -s tfprivacy``).
TF_PRIVACY_STEM = "bu2021_jl_tf_privacy"
TF_PRIVACY_MISSING = "not measured here: run `nox -s tfprivacy`"
TF_PRIVACY_NOT_ON_GPU = "not timed on the GPU (`nox -s tfprivacy` runs on CPU; see the CPU table)"
#: Results stem of :mod:`~reproductions.bu2021_jl.dpcore_tf_timing` (``nox -s dpcoretf``).
DPCORE_TF_STEM = "bu2021_jl_dpcore_tf"
DPCORE_TF_MISSING = "not measured here: run `nox -s dpcoretf`"
DPCORE_TF_NOT_ON_GPU = "not timed on the GPU (`nox -s dpcoretf` runs on CPU; see the CPU table)"
#: The code that measures (model and step builders, timing loop, worker): its fingerprint is part
#: of every cached measurement's key.
MEASURING_CODE = ("dpcore.torch", "dpcore.runs.workers", "dpcore.runs.cells", MODULE)


def stem_for(device: str) -> str:
    """Results stem of a run on ``device`` (:func:`.config.device_stem`: CPU and GPU apart)."""
    return paper.device_stem(STEM, device)


def table_for(device: str) -> str:
    """README marker of the table of a run on ``device``."""
    return paper.device_marker(TABLE, device)


#: Adam's learning rate (the step time does not depend on it).
LEARNING_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class SpeedConfig:
    """One profile of Table 2."""

    profile: str = "quick"
    dataset_size: int = paper.IMDB_TRAIN_SIZE
    lot_size: int = paper.IMDB_LOT
    noise_multiplier: float = paper.NOISE_MULTIPLIER
    max_grad_norm: float = paper.MAX_GRAD_NORM
    jl_dimensions: tuple[int, ...] = paper.TABLE2_JL_DIMENSIONS
    warmup: int = 1
    #: Lots timed after the warm-up (at most; see ``budget``).
    timed_lots: int = 5
    #: Seconds of timed lots per method, estimated from the last warm-up lot; None: no limit.
    budget: float | None = 8.0
    #: torch threads per worker; 0: all cores.
    threads: int = 1
    timeout: float = 300.0


PROFILES = {
    "quick": SpeedConfig(),
    "full": SpeedConfig(
        profile="full", warmup=2, timed_lots=20, budget=None, threads=0, timeout=1800.0
    ),
}


def lots_per_epoch(config: SpeedConfig) -> int:
    """Lots in one epoch: ``round(n / L)`` (98 for IMDb), as :class:`PoissonSampler` counts."""
    return paper.steps_for_epochs(1, config.dataset_size, config.lot_size)


def extrapolate(step_seconds: list[float], lots: int) -> float:
    """Seconds for ``lots`` lots from the timed ones: their mean times ``lots``.

    Example:
        >>> extrapolate([1.0, 2.0, 3.0], 98)
        196.0
    """
    if not step_seconds:
        raise ValueError("no timed lots to extrapolate from")
    return float(np.mean(step_seconds)) * lots


# ----------------------------------------------------------------------------- worker side


def _imdb_train() -> tuple[np.ndarray, np.ndarray]:
    """Token ids and labels of the 25,000 training reviews (cached after the first call)."""
    if DATA_CACHE.is_file():
        with np.load(DATA_CACHE) as cached:
            return cached["x"], cached["y"]
    from dpcore.data.text import imdb_sequences

    x, y, _, _ = imdb_sequences()
    buffer = io.BytesIO()
    np.savez(buffer, x=x.astype(np.int32), y=y.astype(np.int8))
    atomic_write_bytes(DATA_CACHE, buffer.getvalue())
    return x, y


def build(cell: Cell, device: Any, config: SpeedConfig | None = None) -> tuple[Any, Any]:
    """``(model, step)`` for ``cell`` on the real IMDb lots (the worker's hook into the timer)."""
    import torch
    from torch import nn

    from dpcore.torch.models import imdb_lstm
    from dpcore.torch.samplers import PoissonSampler
    from dpcore.torch.training import DPTrainer

    config = config or SpeedConfig()
    x, y = _imdb_train()
    inputs = torch.as_tensor(x, dtype=torch.long).to(device)
    targets = torch.as_tensor(y, dtype=torch.float32).to(device)
    torch.manual_seed(0)
    model = imdb_lstm(recurrent="dplstm" if cell.variant == "dplstm" else "lstm").to(device)
    if cell.method == "nonprivate":
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        loss_fn = nn.BCEWithLogitsLoss()
        generator = torch.Generator().manual_seed(0)
        order: list[torch.Tensor] = []

        def nonprivate() -> None:
            if not order:
                permutation = torch.randperm(len(inputs), generator=generator)
                order.extend(torch.split(permutation, config.lot_size))
            lot = order.pop(0).to(device)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(inputs[lot]), targets[lot]).backward()
            optimizer.step()

        return model, nonprivate
    trainer = DPTrainer.dp_adam(
        model,
        lr=LEARNING_RATE,
        inputs=inputs,
        targets=targets,
        loss_fn=nn.BCEWithLogitsLoss(reduction="none"),
        noise_multiplier=config.noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(
            len(inputs), sampling_probability=config.lot_size / len(inputs), seed=0
        ),
        engine="jl" if cell.method == "dp_adam_jl" else "fast",
        jl_dimension=cell.jl_dimension,
        seed=1,
    )
    return model, trainer.step


# ----------------------------------------------------------------------------- driver side


def cells(config: SpeedConfig) -> list[Cell]:
    """Non-private first (the reference), then exact DP-Adam, then DP-Adam-JL per r."""
    return [
        Cell("imdb_lstm", "nonprivate", "lstm"),
        Cell("imdb_lstm", "dp_adam_exact", "dplstm"),
        *(Cell("imdb_lstm", "dp_adam_jl", "lstm", r) for r in config.jl_dimensions),
    ]


#: The paper's Table 2 row that each of our methods stands beside. The paper's only exact DP
#: row is TF Privacy's vanilla DP-Adam, so our exact DP-Adam is compared with it; the vectorized
#: TF Privacy optimizer is not in the paper (no paper value).
_PAPER_ROW = {
    "nonprivate": "nonprivate",
    "keras_nonprivate": "nonprivate",
    "keras3_nonprivate": "nonprivate",
    "dp_adam_exact": "tf_privacy_vanilla",
    "dpcore_tf_exact": "tf_privacy_vanilla",
    "tf_privacy_vanilla": "tf_privacy_vanilla",
}
#: Our DP-Adam-JL rows (torch, TensorFlow): each stands beside the paper's JL row of its r.
_JL_METHODS = ("dp_adam_jl", "dpcore_tf_jl")


def _paper_key(method: str, r: int | None) -> str | None:
    """Key of :data:`~reproductions.bu2021_jl.config.PAPER_SECONDS_PER_EPOCH`, or None.

    Example:
        >>> _paper_key("dp_adam_jl", 5), _paper_key("tf_privacy_vectorized", None)
        ('jl_5', None)
        >>> _paper_key("dpcore_tf_jl", 30), _paper_key("dpcore_tf_exact", None)
        ('jl_30', 'tf_privacy_vanilla')
    """
    if method in _JL_METHODS:
        return f"jl_{r}"
    return _PAPER_ROW.get(method)


def _paper_columns(method: str, r: int | None) -> dict[str, float | None]:
    key = _paper_key(method, r)
    seconds = None if key is None else paper.PAPER_SECONDS_PER_EPOCH.get(key)
    base = paper.PAPER_SECONDS_PER_EPOCH["nonprivate"]
    return {
        "paper_seconds_per_epoch": seconds,
        "paper_ratio_to_nonprivate": None if seconds is None else seconds / base,
    }


def _row(cell: Cell, measured: dict[str, Any], lots: int, hardware: str) -> dict[str, Any]:
    times = measured.get("step_seconds_all") or []
    return {
        "method": cell.method,
        "r": cell.jl_dimension,
        "variant": cell.variant,
        "seconds_per_epoch": extrapolate(times, lots) if times else None,
        "ratio_to_nonprivate": None,
        "extrapolated": True,
        "timed_steps": len(times),
        "lots_per_epoch": lots,
        "step_seconds_median": measured.get("step_seconds"),
        "peak_rss_mb": measured.get("peak_rss_mb"),
        "peak_gpu_mb": measured.get("peak_gpu_mb"),
        "source": "dpcore",
        "hardware": hardware,
        "error": measured.get("error"),
        **_paper_columns(cell.method, cell.jl_dimension),
    }


def _table_row(
    row: dict[str, Any],
    *,
    r: int | None,
    reference: float | None,
    source: str,
    variant: str,
    hardware: str | None,
    peak_rss_mb: float | None,
    error: str | None,
) -> dict[str, Any]:
    """One row of a TensorFlow timing file (TF Privacy, dpcore TF) in this table's format;
    its ratio divides by ``reference``, the seconds per epoch of that file's non-private row."""
    seconds = row.get("seconds_per_epoch")
    method = str(row.get("method"))
    return {
        "method": method,
        "r": r,
        "variant": variant,
        "seconds_per_epoch": seconds,
        "ratio_to_nonprivate": seconds / reference if seconds and reference else None,
        "extrapolated": bool(row.get("extrapolated", False)),
        "timed_steps": row.get("timed_steps"),
        "lots_per_epoch": row.get("lots_per_epoch"),
        "step_seconds_median": row.get("seconds_per_step"),
        "peak_rss_mb": peak_rss_mb,
        "peak_gpu_mb": None,
        "source": source,
        "hardware": hardware,
        "error": None if seconds else error,
        **_paper_columns(method, r),
    }


def _reference(rows: list[dict[str, Any]], method: str) -> float | None:
    """Seconds per epoch of the row of ``method`` (a file's non-private reference), or None."""
    return next(
        (row.get("seconds_per_epoch") for row in rows if row.get("method") == method),
        None,
    )


def tf_privacy_rows(output: Output | None = None) -> list[dict[str, Any]]:
    """Rows of the TF Privacy timing (``nox -s tfprivacy``) in this table's format; [] if absent.

    The timing is ``output``'s ``bu2021_jl_tf_privacy.json`` (default: figures/). Each ratio
    divides by that file's own ``keras_nonprivate`` row (same framework and machine). The file
    keeps its hardware and each worker's peak memory at the top level (``hardware``,
    ``peak_rss_mb[method]``); a method that failed (e.g. killed for memory) has no row there,
    only ``errors[method]``, and becomes a row with that error and no timing.
    """
    output = output or Output()
    if not output.has_results(TF_PRIVACY_STEM):
        return []
    data = output.load_results(TF_PRIVACY_STEM)
    rows = list(data.get("rows", []))
    peaks = data.get("peak_rss_mb") or {}
    errors = data.get("errors") or {}
    timed = {row.get("method") for row in rows}
    rows += [{"method": method} for method in errors if "@" not in method and method not in timed]
    keras = _reference(rows, "keras_nonprivate")
    return [
        _table_row(
            row,
            r=None,
            reference=keras,
            source="tf_privacy",
            variant="keras",
            hardware=data.get("hardware"),
            peak_rss_mb=peaks.get(str(row.get("method"))),
            error=errors.get(str(row.get("method"))),
        )
        for row in rows
    ]


def dpcore_tf_rows(output: Output | None = None) -> list[dict[str, Any]]:
    """Rows of the dpcore TF timing (``nox -s dpcoretf``) in this table's format; [] if absent.

    The timing is ``output``'s ``bu2021_jl_dpcore_tf.json`` (default: figures/): methods
    ``keras3_nonprivate``, ``dpcore_tf_exact`` and ``dpcore_tf_jl`` (one row per r). Each ratio
    divides by that file's own ``keras3_nonprivate`` row (Keras 3 on the same TensorFlow and
    machine). Every method has a row there, with its peak memory and, if it failed, its
    ``error`` (then no timing); the hardware is at the file's top level.
    """
    output = output or Output()
    if not output.has_results(DPCORE_TF_STEM):
        return []
    data = output.load_results(DPCORE_TF_STEM)
    rows = list(data.get("rows", []))
    keras = _reference(rows, "keras3_nonprivate")
    return [
        _table_row(
            row,
            r=row.get("r"),
            reference=keras,
            source="dpcore_tf",
            variant="keras3",
            hardware=data.get("hardware"),
            peak_rss_mb=row.get("peak_rss_mb"),
            error=row.get("error"),
        )
        for row in rows
    ]


def crossover(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where DP-Adam-JL stops being faster than exact DP-Adam.

    ``first_slower_r``: the smallest measured r whose epoch is slower than the exact one (None
    if none is); ``fitted_r``: where a least-squares line ``a + b r`` through the JL epochs
    crosses the exact epoch (None without two JL points or a positive slope; below 1 means JL is
    slower at every r).

    Example:
        >>> fake = [{"method": "dp_adam_exact", "r": None, "seconds_per_epoch": 30.0}] + [
        ...     {"method": "dp_adam_jl", "r": r, "seconds_per_epoch": 10.0 + 10.0 * r}
        ...     for r in (1, 5)]
        >>> crossover(fake)
        {'exact_seconds_per_epoch': 30.0, 'first_slower_r': 5, 'fitted_r': 2.0}
    """
    exact = next(
        (
            row["seconds_per_epoch"]
            for row in rows
            if row["method"] == "dp_adam_exact" and row["seconds_per_epoch"]
        ),
        None,
    )
    points = sorted(
        (row["r"], row["seconds_per_epoch"])
        for row in rows
        if row["method"] == "dp_adam_jl" and row["seconds_per_epoch"]
    )
    result: dict[str, Any] = {
        "exact_seconds_per_epoch": exact,
        "first_slower_r": None,
        "fitted_r": None,
    }
    if exact is None or not points:
        return result
    result["first_slower_r"] = next((r for r, seconds in points if seconds > exact), None)
    if len(points) >= 2:
        slope, intercept = np.polyfit([r for r, _ in points], [s for _, s in points], 1)
        if slope > 0:
            result["fitted_r"] = round(float((exact - intercept) / slope), 2)
    return result


def _hardware(device: str, threads: int) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)!s} (CUDA)"
    return f"CPU, {threads} torch thread(s) of {os.cpu_count()} cores"


def measuring_setup(device: str, threads: int) -> dict[str, Any]:
    """What, besides the method and the profile, determines a measurement on this machine:
    ``device``, ``threads``, the hardware, the torch version and the measuring code's
    fingerprint (:data:`MEASURING_CODE`)."""
    import torch

    return {
        "device": device,
        "threads": threads,
        "hardware": _hardware(device, threads),
        "torch": torch.__version__,
        "code": code_fingerprint(*MEASURING_CODE),
    }


def measurement_key(cell: Cell, config: SpeedConfig, setup: dict[str, Any]) -> dict[str, Any]:
    """The cache key of ``cell``'s measurement: the cell, the whole profile (lot size, noise
    multiplier, clipping norm, warm-up and timed lots, budget, threads, timeout...) but its list
    of JL dimensions (which cells run, not how one is measured), and ``setup``
    (:func:`measuring_setup`)."""
    fields = dataclasses.asdict(config)
    fields.pop("jl_dimensions")
    return {"study": STEM, "cell": dataclasses.asdict(cell), "config": fields, **setup}


def measure_cell(
    cell: Cell, config: SpeedConfig, setup: dict[str, Any], *, output: Output
) -> dict[str, Any]:
    """``cell`` timed in its own worker (:func:`dpcore.runs.cells.run_timing`), or its cached row.

    A row cached under exactly :func:`measurement_key` is reused; the full profile caches each
    row measured without error (atomically, in ``output``'s run store: ``<runs>/<STEM>/``).
    """
    key = measurement_key(cell, config, setup)
    path = cache.cached_path(output.store(STEM), f"{cell.method}_{cell.jl_dimension}", key)
    cached = cache.load(path, key)
    if cached is not None:
        return cached
    measured = run_timing(
        cell,
        device=setup["device"],
        threads=setup["threads"],
        warmup=config.warmup,
        steps=config.timed_lots,
        budget=config.budget,
        timeout=config.timeout,
        module=MODULE,
        cwd=ROOT,
    )
    if measured.get("error") is None and config.profile == "full":
        cache.store(path, key, measured)
    return measured


@dataclasses.dataclass(frozen=True)
class SpeedRun:
    """One method's timing, a picklable spec for :func:`dpcore.runs.run_many` (:func:`time_cell`):
    the cell, the profile, the device and the run store's root (``Output.runs``) where the full
    profile's measurements are kept."""

    cell: Cell
    config: SpeedConfig
    device: str
    runs: str


def time_cell(run: SpeedRun) -> dict[str, Any]:
    """:func:`measure_cell` of ``run`` on this machine (its hardware, torch and threads: the
    profile's, or all of its cores): the measurement and the hardware and threads it ran on."""
    threads = run.config.threads or os.cpu_count() or 1
    setup = measuring_setup(run.device, threads)
    measured = measure_cell(run.cell, run.config, setup, output=Output(runs=Path(run.runs)))
    return {"measured": measured, "hardware": setup["hardware"], "threads": threads}


def compute(
    profile: str = "quick",
    *,
    config: SpeedConfig | None = None,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Time every method (one process each) and save the rows; finished cells are kept.

    ``output`` (default :class:`~reproductions.harness.Output`) receives the results, keeps the
    full profile's measurements in its run store and gives the TF Privacy timing, if saved.
    Each method is a run of :func:`dpcore.runs.run_many` (:func:`time_cell`): here (``executor``
    None or ``"local"``) or on ``executor``, handed one at a time
    (:func:`dpcore.runs.one_at_a_time`: no two timings share a machine; the machine needs this
    checkout and the tokenised reviews' cache). Each row names the machine that timed it.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
    """
    import torch
    from tqdm import tqdm

    config = profile_config(PROFILES, profile, config)
    fanning_out(executor)  # an invalid choice is refused before anything runs
    output = output or Output()
    device = paper.default_device()
    start = time.perf_counter()
    _imdb_train()  # tokenise once, before the workers
    lots = lots_per_epoch(config)
    rows: list[dict[str, Any]] = []
    machines: list[str] = []
    threads: list[int] = []
    with one_at_a_time(executor) as chosen:
        progress = tqdm(cells(config), desc="IMDb seconds per epoch", unit="method")
        for cell in progress:
            progress.set_postfix_str(cell.label)
            spec = SpeedRun(cell, config, device, str(output.runs))
            (timed,) = run_many(time_cell, [spec], executor=chosen, progress=False, retries=0)
            row = _row(cell, timed["measured"], lots, timed["hardware"])
            rows.append(row)
            machines += [timed["hardware"]] if timed["hardware"] not in machines else []
            threads += [timed["threads"]] if timed["threads"] not in threads else []
            progress.write(
                f"{cell.label}: {row['seconds_per_epoch']} s/epoch ({row['timed_steps']} lots)"
            )
    reference = rows[0]["seconds_per_epoch"]
    for row in rows:
        if reference and row["seconds_per_epoch"]:
            row["ratio_to_nonprivate"] = row["seconds_per_epoch"] / reference
    if device == "cpu":  # the TensorFlow timings run on CPU only: their rows sit beside CPU rows
        rows += tf_privacy_rows(output) + dpcore_tf_rows(output)
    extra = {
        "seed": 0,
        "hardware": " + ".join(machines),
        "device": device,
        "threads": threads[0] if len(threads) == 1 else threads,
        "runs_spread": "one method at a time" + ("" if chosen is None else ", on the executor"),
        "torch": torch.__version__,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "crossover": crossover(rows),
        "paper_hardware": paper.PAPER_HARDWARE,
    }
    output.save_results(stem_for(device), config=config, rows=rows, extra=extra)


if __name__ == "__main__":
    sys.exit(timing_worker(sys.argv[1:], build=build, module=MODULE))
