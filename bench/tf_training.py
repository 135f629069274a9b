"""Step time of DP training in TensorFlow: Keras 3 non-private vs dpcore's TF exact and JL.

The TensorFlow counterpart of :mod:`bench.training` (``python -m bench tf_training``; needs the
``tf`` extra, TensorFlow >= 2.16 with Keras 3). Two models, lots of exactly 256, random data of
the right shape (timing does not depend on the values; seeded):

- ``mnist_cnn``: the TensorFlow Privacy tutorial's CNN in Keras (:func:`mnist_cnn`, 26,010
  parameters) on float32 ``(256, 28, 28, 1)`` images uniform in [0, 1), 10 classes, SGD with
  the torch benchmark's learning rate (:data:`bench.cells.LEARNING_RATE`);
- ``imdb_lstm``: the DP-SGD-JL paper's IMDb model as the TF Privacy baseline builds it
  (:func:`dpcore.runs.tf_cells.imdb_lstm`, 586,369 parameters) on
  ``(256, 150)`` token ids below 8000, binary labels, Adam with learning rate 1e-3 (the paper's
  and the TF Privacy baseline's optimizer).

One *step* is one ``tf.function`` of Keras's ``train_step`` on the lot
(:func:`dpcore.runs.tf_cells.keras_step`):

- ``nonprivate``: the Keras model compiled with the optimizer and the mean loss;
- ``dpcore_tf_exact``: :class:`dpcore.tf.DPModel` (C = 1, sigma = 1, divisor 256), exact
  clipping (``clipping`` says which: ghost norms or per-example Jacobians);
- ``dpcore_tf_jl``: ``DPModel(..., jl_dimension=r)`` for r in :data:`JL_DIMENSIONS` (quick:
  :data:`QUICK_JL_DIMENSIONS`).

Every (model, method) cell runs in its own process (``python -m bench.tf_training --worker``,
started by :func:`bench.cells.run_timing`), with ``threads`` TensorFlow intra- and inter-op
threads (default: every core, as the TF Privacy baseline). Warm-up steps (the first traces the
step) are not timed; ``step_seconds`` is the median of the timed steps (the quick profile times
fewer for slow cells, the full one times fast cells for at least :data:`FULL_MIN_SECONDS`:
:func:`dpcore.runs.cells.timed_count`). ``ratio_to_nonprivate`` divides by the
``nonprivate`` row of the same model in the same run.

Peer (``imdb_lstm`` only): TF Privacy cannot run here (it needs TensorFlow 2.15), so its
per-step times are read from the committed ``figures/bu2021_jl_tf_privacy.json``
(:func:`read_peer`: ``nox -s tfprivacy``, the same model and lot size): ``tf_privacy_vanilla``
(DP-Adam, one microbatch per example) beside our DP rows, its ``keras_nonprivate`` (Keras 2)
beside our non-private row; ``ratio_to_peer`` is ours over its. The meta file says where and
how the peer was timed (hardware, threads, TensorFlow version, commit): a cross-run ratio.

With ``--executor`` each cell (:class:`TimingRun`, :func:`measure_cell`) is a run of
:func:`dpcore.runs.run_many` started on a worker, one cell at a time
(:func:`dpcore.runs.one_at_a_time`): no two timings share a machine. Every row names the
machine that timed it (``hardware``, :func:`dpcore.runs.machine`).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cells import (
    BATCH_SIZE,
    LEARNING_RATE,
    MAX_GRAD_NORM,
    NOISE_MULTIPLIER,
    run_cell,
)
from bench.training import Profile
from dpcore.atomic import atomic_write_text
from dpcore.runs import ExecutorChoice, SupportsSubmit, machine, one_at_a_time, run_many
from dpcore.runs.cells import Cell, timed_count, worker_parser
from dpcore.runs.tf_cells import error_text, imdb_lstm, keras_step, tensorflow_environment
from dpcore.runs.workers import emit_result, peak_rss_mb

__all__ = [
    "FULL",
    "FULL_MIN_SECONDS",
    "JL_DIMENSIONS",
    "METHODS",
    "MODELS",
    "PEER_FILE",
    "QUICK",
    "QUICK_JL_DIMENSIONS",
    "TimingRun",
    "cells",
    "measure_cell",
    "mnist_cnn",
    "read_peer",
    "run",
    "with_ratios",
]

ROOT = Path(__file__).resolve().parents[1]
MODULE = "bench.tf_training"
MODELS = ("mnist_cnn", "imdb_lstm")
METHODS = ("nonprivate", "dpcore_tf_exact", "dpcore_tf_jl")
JL_DIMENSIONS = (1, 5, 10, 30)
QUICK_JL_DIMENSIONS = {"mnist_cnn": (1, 5, 10), "imdb_lstm": (1, 5)}
#: Adam's learning rate on ``imdb_lstm`` (Bu et al. 2021, §5; the TF Privacy baseline's).
IMDB_LEARNING_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class ImdbSizes:
    """The IMDb model's sizes (:func:`dpcore.runs.tf_cells.imdb_lstm`): the paper's and the
    TF Privacy baseline's (vocabulary 8000, reviews of 150 tokens, 64-wide layers), seed 0."""

    vocab_size: int = 8000
    sequence_length: int = 150
    embedding_dim: int = 64
    hidden_size: int = 64
    seed: int = 0


IMDB_SIZES = ImdbSizes()
#: The TF Privacy timing read for the peer column (committed; ``nox -s tfprivacy``).
PEER_FILE = ROOT / "figures" / "bu2021_jl_tf_privacy.json"
#: Our method -> the peer's row beside it.
PEER_METHODS = {
    "nonprivate": "keras_nonprivate",
    "dpcore_tf_exact": "tf_privacy_vanilla",
    "dpcore_tf_jl": "tf_privacy_vanilla",
}

FULL: Profile = {"warmup": 2, "steps": 10, "budget": None, "timeout": 1800}
QUICK: Profile = {"warmup": 2, "steps": 3, "budget": 6.0, "timeout": 600}
"""Two warm-up steps in both: the first traces the ``tf.function``, so the budget of the quick
profile is estimated from the second (see :func:`dpcore.runs.cells.timed_count`)."""

#: The full profile times fast cells for about this many seconds (at least ``steps`` steps):
#: a millisecond CNN step varies by tens of percent from one step to the next on a shared CPU.
FULL_MIN_SECONDS = 10.0


def cells(*, quick: bool, models: tuple[str, ...] = MODELS) -> list[Cell]:
    """Every cell of the benchmark, the non-private reference of each model first.

    Example:
        >>> [cell.label for cell in cells(quick=True, models=("imdb_lstm",))]
        ['imdb_lstm nonprivate', 'imdb_lstm dpcore_tf_exact', 'imdb_lstm dpcore_tf_jl r=1',
         'imdb_lstm dpcore_tf_jl r=5']
    """
    result = []
    for model in models:
        result.append(Cell(model, "nonprivate"))
        result.append(Cell(model, "dpcore_tf_exact"))
        dimensions = QUICK_JL_DIMENSIONS[model] if quick else JL_DIMENSIONS
        result += [Cell(model, "dpcore_tf_jl", None, r) for r in dimensions]
    return result


# ----------------------------------------------------------------------------- worker side


def mnist_cnn(seed: int = 0) -> Any:
    """The TensorFlow Privacy tutorial's MNIST CNN in Keras, built and seeded (26,010 weights).

    ``Conv2D(16, 8, strides 2, same, relu) -> MaxPool2D(2, 1) -> Conv2D(32, 4, strides 2, valid,
    relu) -> MaxPool2D(2, 1) -> Flatten -> Dense(32, relu) -> Dense(10)`` on 28x28x1 images (the
    model of Abadi et al. 2016 as the TF Privacy tutorial trains it; the torch benchmark's
    :func:`dpcore.torch.models.tf_privacy_mnist_cnn`).
    """
    import keras

    keras.utils.set_random_seed(seed)
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
            layers.MaxPool2D(2, 1),
            layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
            layers.MaxPool2D(2, 1),
            layers.Flatten(),
            layers.Dense(32, activation="relu"),
            layers.Dense(10),
        ]
    )


def _lot(model: str, batch_size: int = BATCH_SIZE) -> tuple[Any, Any]:
    """A seeded random lot of ``batch_size`` examples for ``model``, as tensors."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(1)
    if model == "mnist_cnn":
        images = rng.random((batch_size, 28, 28, 1), dtype=np.float32)
        return tf.constant(images), tf.constant(rng.integers(0, 10, batch_size), tf.int32)
    ids = rng.integers(0, 8000, (batch_size, 150))
    labels = rng.integers(0, 2, (batch_size, 1)).astype(np.float32)
    return tf.constant(ids, tf.int32), tf.constant(labels)


def build(cell: Cell, batch_size: int = BATCH_SIZE) -> tuple[Any, Any, Any, Any]:
    """``(network, model, step, lot)`` of ``cell``: the Keras network, what trains it (itself or
    a ``DPModel`` told the lot size), the compiled step and the fixed lot of ``batch_size``."""
    import keras

    if cell.model == "mnist_cnn":
        network = mnist_cnn()
        optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        network = imdb_lstm(IMDB_SIZES)
        optimizer = keras.optimizers.Adam(learning_rate=IMDB_LEARNING_RATE)
        loss = keras.losses.BinaryCrossentropy(from_logits=True)
    model, step = keras_step(
        network,
        private=cell.method != "nonprivate",
        optimizer=optimizer,
        loss=loss,
        jl_dimension=cell.jl_dimension,
        max_grad_norm=MAX_GRAD_NORM,
        noise_multiplier=NOISE_MULTIPLIER,
        expected_lot_size=batch_size,
    )
    return network, model, step, _lot(cell.model, batch_size)


def measure(
    cell: Cell,
    *,
    threads: int,
    warmup: int,
    steps: int,
    budget: float | None,
    batch_size: int = BATCH_SIZE,
    min_seconds: float | None = None,
) -> dict[str, Any]:
    """Time ``cell`` here on a lot of ``batch_size``: ``warmup`` untimed steps, then the median
    of the timed ones (how many: :func:`dpcore.runs.cells.timed_count`).

    An exception is recorded in the row's ``error`` (one line), not raised.
    """
    row: dict[str, Any] = {
        "step_seconds": None,
        "step_seconds_all": None,
        "warmup_seconds": None,
        "timed_steps": None,
        "baseline_rss_mb": None,
        "peak_rss_mb": None,
        "parameters": None,
        "clipping": None,
        "environment": None,
        "error": None,
    }
    try:
        row["environment"] = tensorflow_environment(threads)
        network, model, step, (inputs, targets) = build(cell, batch_size)
        row["parameters"] = int(network.count_params())
        row["baseline_rss_mb"] = peak_rss_mb()

        def timed() -> float:
            start = time.perf_counter()
            float(step(inputs, targets))  # reading the loss back: the step has finished
            return time.perf_counter() - start

        warm = [timed() for _ in range(warmup)]
        count = timed_count(warm, steps, budget, min_seconds)
        times = [timed() for _ in range(count)]
        row.update(
            step_seconds=statistics.median(times),
            step_seconds_all=times,
            warmup_seconds=warm,
            timed_steps=count,
            clipping=None if cell.method == "nonprivate" else model.clipping_method,
        )
    except Exception as error:  # recorded, not raised: one failing method must not stop the run
        row["error"] = error_text(error, 2000)
    row["peak_rss_mb"] = peak_rss_mb()
    return row


def timing_worker(argv: Sequence[str]) -> int:
    """``python -m bench.tf_training --worker CELL --warmup N --steps N [--budget S]
    [--threads N] [--batch-size N] [--min-seconds S]``: :func:`measure` here, then its row as the
    result line."""
    parser = worker_parser(MODULE)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--min-seconds", type=float, default=None)
    args = parser.parse_args(list(argv))
    if args.device != "cpu":
        parser.error("--device: cpu only (the tf extra installs tensorflow-cpu)")
    cell = Cell.from_json(args.worker)
    row = measure(
        cell,
        threads=args.threads,
        warmup=args.warmup,
        steps=args.steps,
        budget=args.budget,
        batch_size=args.batch_size,
        min_seconds=args.min_seconds,
    )
    emit_result(row)
    return 0


# ----------------------------------------------------------------------------- driver side


def read_peer(path: Path = PEER_FILE) -> dict[str, Any] | None:
    """The peer of the ``imdb_lstm`` rows from the TF Privacy timing at ``path``; None if absent.

    ``step_seconds`` maps the file's methods to their median seconds per lot; ``file``,
    ``hardware``, ``threads``, ``lot_size``, versions, ``commit`` and ``created`` say where and
    how they were timed.
    """
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    config = data.get("config") or {}
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:
        shown = str(path)
    return {
        "file": shown,
        "hardware": data.get("hardware"),
        "threads": config.get("threads"),
        "lot_size": config.get("lot_size"),
        "tensorflow": data.get("tensorflow"),
        "keras": data.get("keras"),
        "tensorflow_privacy": data.get("tensorflow_privacy"),
        "commit": data.get("commit"),
        "created": data.get("created"),
        "step_seconds": {
            row["method"]: row.get("seconds_per_step") for row in data.get("rows", [])
        },
        "errors": data.get("errors") or {},
    }


def with_ratios(rows: Sequence[dict[str, Any]], peer: dict[str, Any] | None) -> None:
    """Set each row's ``ratio_to_nonprivate`` (over the same model's ``nonprivate`` row) and, on
    ``imdb_lstm`` rows with a ``peer`` timed at the row's lot size, ``peer_method``,
    ``peer_step_seconds`` and ``ratio_to_peer`` (ours over the peer's)."""
    references = {
        row["model"]: row["step_seconds"] for row in rows if row["method"] == "nonprivate"
    }
    for row in rows:
        usable = peer is not None and peer.get("lot_size") == row["batch_size"]
        seconds, reference = row["step_seconds"], references.get(row["model"])
        row["ratio_to_nonprivate"] = seconds / reference if seconds and reference else None
        row["peer_method"] = row["peer_step_seconds"] = row["ratio_to_peer"] = None
        if usable and row["model"] == "imdb_lstm":
            assert peer is not None
            method = PEER_METHODS[row["method"]]
            theirs = peer["step_seconds"].get(method)
            row["peer_method"] = f"tf_privacy:{method}"
            row["peer_step_seconds"] = theirs
            row["ratio_to_peer"] = seconds / theirs if seconds and theirs else None


def _version(*packages: str) -> str | None:
    """The version of the first of ``packages`` installed (read without importing it)."""
    for package in packages:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_tensorflow() -> None:
    """Raise unless TensorFlow >= 2.16 (Keras 3) is importable, without importing it.

    Raises:
        RuntimeError: TensorFlow is not installed, or older than 2.16.
    """
    version = _version("tensorflow", "tensorflow-cpu")
    if version is None:
        raise RuntimeError(
            "TensorFlow is not installed: install the tf extra (pip install -e '.[tf]')"
        )
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (2, 16):
        raise RuntimeError(f"TensorFlow {version} found; dpcore.tf needs >= 2.16 (Keras 3)")


@dataclasses.dataclass(frozen=True)
class TimingRun:
    """One cell's timing: a picklable spec for :func:`dpcore.runs.run_many` (see
    :func:`measure_cell`)."""

    cell: Cell
    threads: int
    warmup: int
    steps: int
    budget: float | None
    timeout: float
    batch_size: int
    min_seconds: float | None


def measure_cell(run: TimingRun) -> dict[str, Any]:
    """Time ``run.cell`` in a fresh worker process started here: its row, with the worker's
    TensorFlow ``environment`` and the machine that timed it (``hardware``)."""
    result = run_cell(
        run.cell,
        module=MODULE,
        timeout=run.timeout,
        device="cpu",
        threads=run.threads,
        warmup=run.warmup,
        steps=run.steps,
        budget=run.budget,
        batch_size=run.batch_size,
        min_seconds=run.min_seconds,
    )
    measured = dict(result.row or {}) if result.ok else {"error": result.error}
    return {
        **dataclasses.asdict(run.cell),
        "batch_size": run.batch_size,
        "step_seconds": None,
        "peak_rss_mb": None,
        "threads": run.threads,
        "device": "cpu",
        "hardware": machine(),
        **measured,
    }


def run(
    results_dir: Path,
    *,
    quick: bool = False,
    threads: int | None = None,
    models: tuple[str, ...] = MODELS,
    peer_file: Path = PEER_FILE,
    batch_size: int = BATCH_SIZE,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Measure every cell, write ``tf_training.json`` (+ ``tf_training.meta.json``), return the
    rows (saved after every cell, so a run stopped early keeps what it measured).

    Args:
        results_dir: where the JSON files go.
        quick: :data:`QUICK` and :data:`QUICK_JL_DIMENSIONS` (see the module doc).
        threads: TensorFlow threads in every worker (None: every core of this machine).
        models: a subset of :data:`MODELS`.
        peer_file: the TF Privacy timing of the peer column.
        batch_size: the lot size (the benchmark's is 256; smaller for a smoke test).
        executor: where each cell's worker is started (:func:`measure_cell`, a run of
            :func:`dpcore.runs.run_many`): None or ``"local"``, here; else any ``run_many``
            executor, handed one cell at a time (:func:`dpcore.runs.one_at_a_time`), so no two
            timings ever share a machine. The machine needs this checkout (``python -m
            bench.tf_training`` in it) and TensorFlow; each row names it (``hardware``).

    Raises:
        ValueError: an unknown model.
        InvalidParameterError: ``executor`` is not a valid choice (before anything runs).
    """
    from tqdm import tqdm

    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; expected names in {MODELS}")
    from dpcore.provenance import git_commit

    threads = threads or os.cpu_count() or 1
    config = QUICK if quick else FULL
    peer = read_peer(peer_file)
    commit = git_commit(ROOT)  # before the first save changes the tracked results
    started = time.perf_counter()
    environment: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    todo = cells(quick=quick, models=models)
    with one_at_a_time(executor) as chosen:
        progress = tqdm(todo, desc="TensorFlow training benchmark", unit="cell")
        for cell in progress:
            progress.set_postfix_str(cell.label)
            timing = TimingRun(
                cell, threads, config["warmup"], config["steps"], config["budget"],
                config["timeout"], batch_size, None if quick else FULL_MIN_SECONDS,
            )  # fmt: skip
            (row,) = run_many(measure_cell, [timing], executor=chosen, progress=False, retries=0)
            environment = row.pop("environment", None) or environment
            rows.append(row)
            seconds = row["step_seconds"]
            outcome = f"{seconds:.3f} s/step" if seconds is not None else f"error: {row['error']}"
            progress.write(f"{cell.label}: {outcome}"[:300])
            with_ratios(rows, peer)
            _save(
                results_dir,
                rows,
                quick=quick,
                threads=threads,
                batch_size=batch_size,
                models=models,
                environment=environment,
                peer=peer,
                wall_seconds=time.perf_counter() - started,
                cells_total=len(todo),
                commit=commit,
            )
    return rows


def _save(
    results_dir: Path,
    rows: list[dict[str, Any]],
    *,
    commit: str,
    quick: bool,
    threads: int,
    batch_size: int,
    models: tuple[str, ...],
    environment: dict[str, Any],
    peer: dict[str, Any] | None,
    wall_seconds: float,
    cells_total: int,
) -> None:
    from dpcore.provenance import provenance

    config = QUICK if quick else FULL
    atomic_write_text(results_dir / "tf_training.json", json.dumps(rows, indent=2) + "\n")
    peer_note = (
        "peer_* columns (imdb_lstm only): TF Privacy's per-step times read from "
        f"{peer['file']} (not timed in this run: TF Privacy needs TensorFlow 2.15), timed on "
        f"{peer['hardware']} with TensorFlow {peer['tensorflow']}, TF Privacy "
        f"{peer['tensorflow_privacy']}, lot {peer['lot_size']}, commit {peer['commit']}; "
        "ratio_to_peer = ours / theirs across runs (and possibly machines)."
        if peer is not None
        else f"no peer column: {PEER_FILE.relative_to(ROOT)} is absent (nox -s tfprivacy)"
    )
    meta = provenance(
        root=ROOT,
        commit=commit,
        benchmark="tf_training",
        tensorflow=environment.get("tensorflow") or _version("tensorflow", "tensorflow-cpu"),
        keras=environment.get("keras") or _version("keras"),
        hardware=environment.get("hardware"),
        threads=threads,
        quick=quick,
        device="cpu",
        date=datetime.date.today().isoformat(),
        wall_seconds=wall_seconds,
        cells_measured=len(rows),
        cells_total=cells_total,
        peer=peer,
        notes=[
            "Each (model, method) cell runs in its own process; peak_rss_mb is its VmHWM.",
            f"One step = one tf.function of Keras's train_step on a fixed lot of {batch_size}; "
            "dpcore_tf_* wrap the network in dpcore.tf.DPModel.",
            peer_note,
        ],
        config={
            "batch_size": batch_size,
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "optimizer": {
                "mnist_cnn": f"SGD lr {LEARNING_RATE}",
                "imdb_lstm": f"Adam lr {IMDB_LEARNING_RATE}",
            },
            "warmup_steps": config["warmup"],
            "timed_steps": config["steps"],
            "timed_seconds_budget_per_cell": config["budget"],
            "timed_seconds_at_least": None if quick else FULL_MIN_SECONDS,
            "statistic": "median",
            "jl_dimensions": {
                m: list(QUICK_JL_DIMENSIONS[m] if quick else JL_DIMENSIONS) for m in models
            },
            "reference": "nonprivate row of the same model (Keras 3, same run)",
        },
    )
    atomic_write_text(results_dir / "tf_training.meta.json", json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(timing_worker(sys.argv[1:]))
