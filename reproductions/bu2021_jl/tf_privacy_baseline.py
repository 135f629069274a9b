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
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.errors import InvalidParameterError
from reproductions.bu2021_jl import config as paper
from reproductions.common import save_results

STEM = "bu2021_jl_tf_privacy"
MODULE = "reproductions.bu2021_jl.tf_privacy_baseline"
CHECKPOINT_DIR = paper.CHECKPOINTS / STEM
#: Row names, in the order they are timed.
METHODS = ("keras_nonprivate", "tf_privacy_vanilla", "tf_privacy_vectorized")
DP_METHODS = frozenset(METHODS[1:])


@dataclasses.dataclass(frozen=True)
class TfPrivacyConfig:
    """One profile of the TF Privacy timing (paper values from Bu et al. 2021, §5)."""

    profile: str = "quick"
    dataset_size: int = paper.IMDB_TRAIN_SIZE
    lot_size: int = paper.IMDB_LOT
    vocab_size: int = 8000
    sequence_length: int = 150
    embedding_dim: int = 64
    hidden_size: int = 64
    learning_rate: float = 1e-3
    l2_norm_clip: float = paper.MAX_GRAD_NORM
    noise_multiplier: float = paper.NOISE_MULTIPLIER
    #: Untimed lots before the non-private and before each DP method's timed lots.
    nonprivate_warmup: int = 2
    dp_warmup: int = 1
    #: Timed lots: non-private, and each TF Privacy optimizer (k, extrapolated to an epoch).
    nonprivate_lots: int = 10
    dp_lots: int = 2
    #: Also time ``VectorizedDPKerasAdamOptimizer`` (an extra row).
    vectorized: bool = True
    #: Smaller lots at which the vanilla optimizer is also timed (how its cost grows with L).
    scaling_lots: tuple[int, ...] = (32, 64)
    #: TensorFlow intra- and inter-op threads; 0: every core.
    threads: int = 0
    seed: int = 0


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


# ----------------------------------------------------------------------------- TensorFlow side


def configure_tensorflow(threads: int) -> dict[str, Any]:
    """Import TensorFlow with ``threads`` intra-/inter-op threads; versions and hardware.

    Must run before any TensorFlow operation (the thread pools are fixed at the first one).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    import tensorflow_privacy

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    gpus = [device.name for device in tf.config.list_physical_devices("GPU")]
    where = f"GPU {', '.join(gpus)}" if gpus else f"CPU {_cpu_name()}"
    return {
        "hardware": f"{where}, {threads} TensorFlow thread(s) of {os.cpu_count()} cores",
        "gpus": gpus,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tensorflow_privacy": tensorflow_privacy.__version__,
    }


def _proc(path: str, key: str) -> str | None:
    """The value of ``key`` in a ``/proc`` file such as ``/proc/meminfo`` (Linux); else None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_name() -> str:
    memory = _proc("/proc/meminfo", "MemTotal")  # e.g. "24683464 kB"
    ram = f", {int(memory.split()[0]) / 2**20:.1f} GiB RAM" if memory else ""
    return (_proc("/proc/cpuinfo", "model name") or platform.machine()) + ram


def build_model(config: TfPrivacyConfig) -> Any:
    """The tutorial's bidirectional LSTM (see the module docstring), built and seeded."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(config.seed)
    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(config.sequence_length,), dtype="int32"),
            layers.Embedding(config.vocab_size, config.embedding_dim),
            layers.Bidirectional(layers.LSTM(config.hidden_size)),
            layers.Dense(config.hidden_size, activation="relu"),
            layers.Dense(1),
        ]
    )


def _optimizer(method: str, config: TfPrivacyConfig) -> Any:
    import tensorflow as tf
    import tensorflow_privacy

    if method == "keras_nonprivate":
        return tf.keras.optimizers.legacy.Adam(learning_rate=config.learning_rate)
    classes = {
        "tf_privacy_vanilla": tensorflow_privacy.DPKerasAdamOptimizer,
        "tf_privacy_vectorized": tensorflow_privacy.VectorizedDPKerasAdamOptimizer,
    }
    return classes[method](
        l2_norm_clip=config.l2_norm_clip,
        noise_multiplier=config.noise_multiplier,
        num_microbatches=config.lot_size,
        learning_rate=config.learning_rate,
    )


def time_method(
    method: str,
    config: TfPrivacyConfig,
    data: tuple[np.ndarray, np.ndarray],
    *,
    warmup: int,
    lots: int,
    on_lot: Callable[[float], None] | None = None,
) -> list[float]:
    """Seconds of each of ``lots`` timed lots of ``method`` after ``warmup`` untimed ones.

    Lots are consecutive slices of one seeded permutation of the training set. Each timed lot
    is one call of the compiled step, ended by reading the loss back (so the step has finished);
    ``on_lot`` receives each lot's seconds as it is measured.
    """
    import tensorflow as tf

    x, y = data
    model = build_model(config)
    optimizer = _optimizer(method, config)
    private = method in DP_METHODS
    loss_fn = tf.keras.losses.BinaryCrossentropy(
        from_logits=True,
        reduction=tf.keras.losses.Reduction.NONE if private else tf.keras.losses.Reduction.AUTO,
    )

    @tf.function
    def step(inputs: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, model(inputs, training=True))
        # TF Privacy needs the vector of per-example losses and the tape.
        optimizer.minimize(loss, model.trainable_variables, tape=tape)
        return tf.reduce_mean(loss)

    order = np.random.default_rng(config.seed).permutation(len(x))
    per_epoch = len(x) // config.lot_size
    seconds: list[float] = []
    for index in range(warmup + lots):
        lot = order[(index % per_epoch) * config.lot_size :][: config.lot_size]
        inputs = tf.constant(x[lot], dtype=tf.int32)
        targets = tf.constant(y[lot].reshape(-1, 1), dtype=tf.float32)
        start = time.perf_counter()
        float(step(inputs, targets))
        elapsed = time.perf_counter() - start
        if index >= warmup:
            seconds.append(elapsed)
            if on_lot is not None:
                on_lot(elapsed)
    return seconds


def load_data(config: TfPrivacyConfig) -> tuple[np.ndarray, np.ndarray]:
    """The 25,000 training reviews as ``(ids, labels)`` (vocabulary and length from ``config``)."""
    from dpcore.data.text import imdb_sequences

    x, y, _, _ = imdb_sequences(config.vocab_size, config.sequence_length)
    return x.astype(np.int32), y.astype(np.float32)


# ----------------------------------------------------------------------------- worker side


def _checkpoint(config: TfPrivacyConfig, method: str, tensorflow: str) -> Path:
    """Where the full profile keeps one method's timed lots, keyed by all that sets a lot's time.

    The numbers of lots are left out of the key, so a run asked for more lots extends the last.
    """
    fields = {**dataclasses.asdict(config), "tensorflow": tensorflow}
    for name in ("nonprivate_lots", "dp_lots", "vectorized", "scaling_lots"):
        fields.pop(name)
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
    return CHECKPOINT_DIR / f"{method}_{digest}.json"


def _wanted(method: str, config: TfPrivacyConfig) -> int:
    return config.dp_lots if method in DP_METHODS else config.nonprivate_lots


def _stored(path: Path | None) -> list[float]:
    if path is None or not path.is_file():
        return []
    return [float(seconds) for seconds in json.loads(path.read_text())["step_seconds"]]


def measure(
    method: str,
    config: TfPrivacyConfig,
    data: tuple[np.ndarray, np.ndarray],
    checkpoint: Path | None,
    timer: Callable[..., list[float]] | None = None,
) -> list[float]:
    """Timed lots of one method (``timer``: :func:`time_method`), resuming ``checkpoint``."""
    from tqdm import tqdm

    wanted = _wanted(method, config)
    done = _stored(checkpoint)[:wanted]
    if len(done) >= wanted:
        return done
    bar = tqdm(total=wanted, initial=len(done), desc=method, unit="lot")

    def record(seconds: float) -> None:
        done.append(seconds)
        bar.update(1)
        bar.set_postfix_str(f"{seconds:.2f} s")
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.write_text(json.dumps({"method": method, "step_seconds": done}) + "\n")

    warmup = config.dp_warmup if method in DP_METHODS else config.nonprivate_warmup
    bar.write(f"{method}: {warmup} warm-up lot(s), then {wanted - len(done)} timed")
    (timer or time_method)(
        method, config, data, warmup=warmup, lots=wanted - len(done), on_lot=record
    )
    bar.close()
    return done


def _peak_rss_mb() -> float | None:
    """This process's peak resident memory (``VmHWM``, Linux), in MiB."""
    peak = _proc("/proc/self/status", "VmHWM")  # e.g. "1234 kB"
    return None if peak is None else round(int(peak.split()[0]) / 1024, 1)


def worker(
    method: str, config: TfPrivacyConfig, data_path: Path, checkpoint: Path | None
) -> dict[str, Any]:
    """Time ``method`` in this fresh process; the dictionary :func:`run_worker` reads back."""
    environment = configure_tensorflow(config.threads)
    with np.load(data_path) as stored:
        seconds = measure(method, config, (stored["x"], stored["y"]), checkpoint)
    parameters = int(build_model(config).count_params())
    return {
        "step_seconds": seconds,
        "environment": environment,
        "parameters": parameters,
        "peak_rss_mb": _peak_rss_mb(),
    }


# ----------------------------------------------------------------------------- driver side


def run_worker(
    method: str, config: TfPrivacyConfig, data_path: Path, checkpoint: Path | None
) -> dict[str, Any]:
    """:func:`worker` in a child process, so that each optimizer starts on an empty heap.

    At a lot of 256 the vanilla optimizer's worker peaks above 22.7 GiB and the vectorized one's
    at about 16.5 GiB (CPU); in one process the second would start on top of the first's heap.
    """
    out = data_path.with_name(f"{method}.json")
    command = [sys.executable, "-m", MODULE, "--worker", method, "--data", str(data_path)]
    command += ["--config", json.dumps(dataclasses.asdict(config)), "--out", str(out)]
    command += ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
    code = subprocess.run(command, check=False).returncode
    if code != 0:
        hint = " (killed: out of memory?)" if code in (-9, 137) else ""
        raise RuntimeError(f"the worker exited with status {code}{hint}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


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
    method: str, config: TfPrivacyConfig, data: Path, checkpoint: Path | None, extra: dict, key: str
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


def compute(profile: str = "quick", *, lots: int | None = None, threads: int | None = None) -> Path:
    """Time every method and save ``figures/bu2021_jl_tf_privacy.{json,csv}``; returns the JSON.

    ``lots`` overrides the profile's timed lots per TF Privacy optimizer, ``threads`` its
    TensorFlow threads (0: every core). The file is rewritten after each method; a failing
    method is left out of the rows, its error kept under ``errors``. The vanilla optimizer is
    also timed at ``scaling_lots`` (``lot_scaling``: seconds per lot and peak memory by lot
    size, and the fitted exponent). The full profile resumes from its checkpoints.
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
    start = time.perf_counter()
    tensorflow = str(_version("tensorflow"))
    per_epoch = lots_per_epoch(config.dataset_size, config.lot_size)
    extra: dict[str, Any] = {
        "seed": config.seed,
        "hardware": f"CPU {_cpu_name()}, {used} TensorFlow thread(s) of {os.cpu_count()} cores",
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
        return save_results(STEM, config=config, rows=rows, extra=extra)

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
            checkpoint = _checkpoint(config, method, tensorflow) if profile == "full" else None
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
    for name in ("--config", "--data", "--out", "--checkpoint"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        fields = json.loads(args.config)
        config = TfPrivacyConfig(**{**fields, "scaling_lots": tuple(fields["scaling_lots"])})
        checkpoint = Path(args.checkpoint) if args.checkpoint else None
        result = worker(args.worker, config, Path(args.data), checkpoint)
        Path(args.out).write_text(json.dumps(result) + "\n")
        return 0
    print(f"saved {compute(args.profile, lots=args.lots, threads=args.threads)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
