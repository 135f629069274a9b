"""Bu et al. 2021, Table 2 baseline: TF Privacy's DP-Adam on the IMDb LSTM, timed on our machine.

The paper (arXiv 2102.03013, §5, Table 2; one Tesla P100) reports 12 s per IMDb epoch for
non-private Adam and 19,317 s for the "vanilla" DP-Adam of TF Privacy, the baseline of its
DP-Adam-JL. This module times the pair with TensorFlow on our hardware for
:mod:`reproductions.bu2021_jl.speed`. Run it with ``nox -s tfprivacy`` (its own environment:
TensorFlow 2.15, TF Privacy 0.9); TensorFlow is imported only inside functions.

Model (§5: "the same single-layer bidirectional LSTM as in the [TensorFlow] tutorial", "8k
vocabulary"): ``Embedding(8000, 64) -> Bidirectional(LSTM(64)) -> Dense(64, relu) -> Dense(1)``
on 150 token ids from :func:`dpcore.data.text.imdb_sequences`, logistic loss. Keras counts
586,369 parameters (torch's ``nn.LSTM`` in :func:`dpcore.torch.models.imdb_lstm` has 586,881: two
biases per gate). The tutorial's ``imdb_reviews/subwords8k`` vocabulary of 8,185 sub-words gives
598,209; our 8,000 words are an *assumption*. No masking of the padding (as in our torch model).

Methods, on lots of exactly 256 reviews, Adam with learning rate 1e-3, one ``tf.function`` step:

- ``keras_nonprivate``: ``tf.keras.optimizers.legacy.Adam`` (TF Privacy's base class), mean loss;
- ``tf_privacy_vanilla``: ``tensorflow_privacy.DPKerasAdamOptimizer``, ``l2_norm_clip`` 1,
  ``noise_multiplier`` 1, ``num_microbatches`` 256 (one per example). Its per-example gradients
  are one ``tape.jacobian`` of the 256 losses (vectorised by ``pfor``: the backward pass of the
  whole lot once per example, so time and memory grow about like L^2), then a ``tf.while_loop``
  clips and sums them. The class of early 2021 clipped with ``tf.map_fn`` after the same Jacobian;
- ``tf_privacy_vectorized``: ``VectorizedDPKerasAdamOptimizer`` (same Jacobian, clipping by
  ``tf.vectorized_map``), an extra row: the paper's baseline is the class above.

Each method runs in its own process. Warm-up lots (tracing) are not timed; ``seconds_per_step``
is the median timed lot and ``seconds_per_epoch`` that median times ``ceil(25,000 / 256) = 98``
(``extrapolated``), or the measured sum when a whole epoch was timed. The vanilla optimizer is
also timed at smaller lots (``lot_scaling``). On CPU it needs about 23 GiB at a lot of 256: on a
24 GiB machine its worker can be killed for memory, which is saved under ``errors``.

This module is the driver (profiles, child processes, saved results, command line); the
TensorFlow model and timing that run in each child process are in
:mod:`~reproductions.bu2021_jl.tf_privacy_worker` (re-exported here).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.runs import workers as protocol
from dpcore.runs.tf_cells import cpu_name
from dpcore.runs.tf_cells import imdb_lstm as build_model
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.tf_privacy_worker import (
    DP_METHODS,
    METHODS,
    TfPrivacyConfig,
    _stored,
    _wanted,
    configure_tensorflow,
    measure,
    time_method,
    worker,
)

if TYPE_CHECKING:
    from reproductions.harness.output import Output

__all__ = [
    "DP_METHODS",
    "METHODS",
    "MODULE",
    "PROFILES",
    "STEM",
    "TfPrivacyConfig",
    "build_model",
    "compute",
    "configure_tensorflow",
    "default_output",
    "load_data",
    "lot_exponent",
    "lots_per_epoch",
    "main",
    "measure",
    "run_module_worker",
    "run_worker",
    "summarize",
    "time_method",
    "worker",
]

STEM = "bu2021_jl_tf_privacy"
MODULE = "reproductions.bu2021_jl.tf_privacy_baseline"


PROFILES = {
    "quick": TfPrivacyConfig(),
    # non-private: one whole epoch timed; DP: 10 lots after 1 warm-up (an epoch takes hours).
    "full": TfPrivacyConfig(
        profile="full",
        nonprivate_warmup=3,
        nonprivate_lots=98,
        dp_lots=10,
        scaling_lots=(32, 64, 128),
    ),
}


def default_output() -> Output:
    """The default :class:`~reproductions.harness.output.Output` (figures/, the run store).

    This module runs in the TF Privacy environment (``nox -s tfprivacy``), which has no torch;
    :mod:`reproductions.harness` loads its torch parts only when they are used.
    """
    from reproductions.harness.output import Output

    return Output()


def lots_per_epoch(dataset_size: int, lot_size: int) -> int:
    """Lots in one epoch of fixed-size lots, ``ceil(n / L)`` (Keras' batches per epoch).

    Example:
        >>> lots_per_epoch(25_000, 256)
        98
    """
    for name, value in (("dataset_size", dataset_size), ("lot_size", lot_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameterError(name, "an integer >= 1", value)
    return math.ceil(dataset_size / lot_size)


def summarize(method: str, step_seconds: Sequence[float], lots: int) -> dict[str, Any]:
    """The saved row of one method from its timed lots.

    ``seconds_per_step`` is their median; ``seconds_per_epoch`` is the sum of the first ``lots``
    of them when at least a whole epoch was timed, else the median times ``lots`` (extrapolated).

    Example:
        >>> row = summarize("tf_privacy_vanilla", [10.0, 30.0, 11.0], 98)
        >>> row["seconds_per_step"], row["seconds_per_epoch"], row["extrapolated"]
        (11.0, 1078.0, True)
        >>> summarize("keras_nonprivate", [0.5] * 4, 4)["seconds_per_epoch"]
        2.0
    """
    if not step_seconds:
        raise InvalidParameterError("step_seconds", "at least one timed lot", list(step_seconds))
    if any(not math.isfinite(s) or s < 0 for s in step_seconds):
        raise InvalidParameterError("step_seconds", "finite and >= 0", list(step_seconds))
    if isinstance(lots, bool) or not isinstance(lots, int) or lots < 1:
        raise InvalidParameterError("lots", "an integer >= 1", lots)
    median = float(statistics.median(step_seconds))
    whole = len(step_seconds) >= lots
    return {
        "method": method,
        "seconds_per_step": median,
        "seconds_per_epoch": float(sum(step_seconds[:lots])) if whole else median * lots,
        "extrapolated": not whole,
        "timed_steps": len(step_seconds),
        "lots_per_epoch": lots,
    }


def load_data(config: TfPrivacyConfig) -> tuple[np.ndarray, np.ndarray]:
    """The 25,000 training reviews as ``(ids, labels)`` (vocabulary and length from ``config``)."""
    from dpcore.data.text import imdb_sequences

    x, y, _, _ = imdb_sequences(config.vocab_size, config.sequence_length)
    return x.astype(np.int32), y.astype(np.float32)


def _checkpoint(config: TfPrivacyConfig, method: str, tensorflow: str, output: Output) -> Path:
    """Where the full profile keeps one method's timed lots (in ``output``'s run store), keyed by
    all that sets a lot's time.

    The numbers of lots are left out of the key, so a run asked for more lots extends the last.
    """
    fields = {**dataclasses.asdict(config), "tensorflow": tensorflow}
    for name in ("nonprivate_lots", "dp_lots", "vectorized", "scaling_lots"):
        fields.pop(name)
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
    return output.store(STEM) / f"{method}_{digest}.json"


def run_module_worker(
    module: str,
    method: str,
    config: Any,
    data_path: Path,
    checkpoint: Path | None,
    *,
    options: Sequence[str] = (),
    timeout: float | None = None,
) -> dict[str, Any]:
    """``python -m <module> --worker <method> --data ... --config ... [options]`` in a child
    process; the dictionary of its one result line (:mod:`dpcore.runs.workers`).

    ``config`` is a dataclass, passed as JSON; the child's progress goes to stderr, shown as it
    runs. ``timeout`` (seconds; None: none) stops a child that runs longer.

    Raises:
        RuntimeError: the child exited without a readable result line (killed for memory,
            crashed) or was stopped at ``timeout``.
    """
    command = [sys.executable, "-m", module, "--worker", method, "--data", str(data_path)]
    command += ["--config", json.dumps(dataclasses.asdict(config))]
    command += ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
    command += list(options)
    limits: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    result = protocol.run_worker(command, show_stderr=True, **limits)
    if result.ok and result.row is not None:
        return result.row
    if result.status == "timeout":
        raise RuntimeError(f"the worker was stopped after {timeout:.0f} s")
    hint = " (killed: out of memory?)" if result.oom else ""
    if result.status == "unreadable":
        raise RuntimeError(f"the worker printed an unreadable result line: {result.problem}{hint}")
    raise RuntimeError(f"the worker exited with status {result.returncode}{hint}")


def run_worker(
    method: str, config: TfPrivacyConfig, data_path: Path, checkpoint: Path | None
) -> dict[str, Any]:
    """:func:`worker` in a child process, so that each optimizer starts on an empty heap.

    At a lot of 256 the vanilla optimizer's worker peaks above 22.7 GiB and the vectorized one's
    at about 16.5 GiB (CPU); in one process the second would start on top of the first's heap.
    The child prints its dictionary as the one result line of :mod:`dpcore.runs.workers` (its
    progress goes to stderr, shown as it runs).

    Raises:
        RuntimeError: the child exited without a readable result line (killed for memory,
            crashed).
    """
    return run_module_worker(MODULE, method, config, data_path, checkpoint)


def _version(package: str) -> str | None:
    """An installed package's version, read without importing it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def lot_exponent(points: Sequence[tuple[int, float]]) -> float | None:
    """Least-squares ``b`` of ``seconds = a * lot ** b`` (log-log line); None below two lots.

    Example:
        >>> lot_exponent([(32, 1.0), (64, 4.0), (128, 16.0)])
        2.0
    """
    if len({lot for lot, _ in points}) < 2:
        return None
    logs = np.log(np.asarray(points, dtype=float))
    return round(float(np.polyfit(logs[:, 0], logs[:, 1], 1)[0]), 3)


def _attempt(
    method: str,
    config: TfPrivacyConfig,
    data: Path,
    checkpoint: Path | None,
    extra: dict[str, Any],
    key: str,
) -> list[float] | None:
    """One worker's timed lots, its environment and memory into ``extra``; None if it failed."""
    try:
        result = run_worker(method, config, data, checkpoint)
    except Exception as error:  # a failed optimizer is reported, not fatal
        extra["errors"][key] = f"{type(error).__name__}: {error}"[:2000]
        print(f"{key} failed: {extra['errors'][key]}")
        return None
    extra.update(result["environment"], parameters=result["parameters"])
    extra["peak_rss_mb"][key] = result["peak_rss_mb"]
    return list(result["step_seconds"])


def compute(
    profile: str = "quick",
    *,
    lots: int | None = None,
    threads: int | None = None,
    output: Output | None = None,
) -> Path:
    """Time every method and save ``bu2021_jl_tf_privacy.{json,csv}``; returns the JSON.

    ``lots`` overrides the profile's timed lots per TF Privacy optimizer, ``threads`` its
    TensorFlow threads (0: every core). The file is rewritten after each method; a failing
    method is left out of the rows, its error kept under ``errors``. The vanilla optimizer is
    also timed at ``scaling_lots`` (``lot_scaling``: seconds per lot and peak memory by lot
    size, and the fitted exponent). The full profile resumes from its checkpoints. ``output``
    (default :func:`default_output`: figures/ and ``reproductions/checkpoints/``) receives the
    files and keeps the checkpoints in its run store.
    """
    if profile not in PROFILES:
        raise InvalidParameterError("profile", f"one of {sorted(PROFILES)}", profile)
    config = PROFILES[profile]
    if lots is not None:
        if isinstance(lots, bool) or not isinstance(lots, int) or lots < 1:
            raise InvalidParameterError("lots", "an integer >= 1", lots)
        config = dataclasses.replace(config, dp_lots=lots)
    used = (config.threads if threads is None else threads) or os.cpu_count() or 1
    config = dataclasses.replace(config, threads=used)
    output = output or default_output()
    start = time.perf_counter()
    tensorflow = str(_version("tensorflow"))
    per_epoch = lots_per_epoch(config.dataset_size, config.lot_size)
    extra: dict[str, Any] = {
        "seed": config.seed,
        "hardware": f"CPU {cpu_name()}, {used} TensorFlow thread(s) of {os.cpu_count()} cores",
        "tensorflow": tensorflow,
        "tensorflow_privacy": _version("tensorflow-privacy"),
        "errors": {},
        "peak_rss_mb": {},
        "lot_scaling": {"method": "tf_privacy_vanilla", "points": [], "exponent": None},
        "paper_seconds_per_epoch": {
            "keras_nonprivate": paper.PAPER_SECONDS_PER_EPOCH["nonprivate"],
            "tf_privacy_vanilla": paper.PAPER_SECONDS_PER_EPOCH["tf_privacy_vanilla"],
        },
        "paper_hardware": paper.PAPER_HARDWARE,
    }
    scaling = extra["lot_scaling"]
    rows: list[dict[str, Any]] = []

    def save() -> Path:
        points = [(point["lot_size"], point["seconds_per_step"]) for point in scaling["points"]]
        scaling["exponent"] = lot_exponent(points)
        extra["wall_time_s"] = round(time.perf_counter() - start, 1)
        return output.save_results(STEM, config=config, rows=rows, extra=extra)

    def add_point(lot: int, seconds: list[float], key: str) -> None:
        median = float(statistics.median(seconds))
        peak = extra["peak_rss_mb"].get(key)
        scaling["points"].append({"lot_size": lot, "seconds_per_step": median, "peak_rss_mb": peak})

    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "imdb_train.npz"
        x, y = load_data(config)
        np.savez(data, x=x, y=y)
        for lot in config.scaling_lots:
            key = f"tf_privacy_vanilla@{lot}"
            small = dataclasses.replace(config, lot_size=lot)
            if (
                seconds := _attempt("tf_privacy_vanilla", small, data, None, extra, key)
            ) is not None:
                add_point(lot, seconds, key)
                save()
        for method in (m for m in METHODS if config.vectorized or m != "tf_privacy_vectorized"):
            checkpoint = (
                _checkpoint(config, method, tensorflow, output) if profile == "full" else None
            )
            seconds = _stored(checkpoint)[: _wanted(method, config)]
            if len(seconds) < _wanted(method, config):
                seconds = _attempt(method, config, data, checkpoint, extra, method) or []
            if not seconds:
                continue
            rows.append(row := summarize(method, seconds, per_epoch))
            if method == "tf_privacy_vanilla":
                add_point(config.lot_size, seconds, method)
            how = "extrapolated from" if row["extrapolated"] else "measured over"
            print(
                f"{method}: {row['seconds_per_step']:.3f} s per lot, "
                f"{row['seconds_per_epoch']:,.1f} s per epoch ({how} {row['timed_steps']} lots)"
            )
            save()
    return save()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reproductions.bu2021_jl.tf_privacy_baseline [--profile P] [--lots K]``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Time TF Privacy's DP-Adam on the IMDb LSTM (Bu et al. 2021, Table 2).",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--lots", type=int, help="timed lots per TF Privacy optimizer (k)")
    parser.add_argument("--threads", type=int, help="TensorFlow threads (default: every core)")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    for name in ("--config", "--data", "--checkpoint"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        fields = json.loads(args.config)
        config = TfPrivacyConfig(**{**fields, "scaling_lots": tuple(fields["scaling_lots"])})
        checkpoint = Path(args.checkpoint) if args.checkpoint else None
        protocol.emit_result(worker(args.worker, config, Path(args.data), checkpoint))
        return 0
    print(f"saved {compute(args.profile, lots=args.lots, threads=args.threads)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
