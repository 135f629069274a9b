"""Worker side of :mod:`reproductions.bu2021_jl.tf_privacy_baseline`: TensorFlow model and timing.

Each method is timed in its own child process, ``python -m
reproductions.bu2021_jl.tf_privacy_baseline --worker ...`` (started by
:func:`~reproductions.bu2021_jl.tf_privacy_baseline.run_worker`), which calls :func:`worker`:
configure TensorFlow's threads, build the tutorial's bidirectional LSTM and the optimizer (Keras
Adam or TF Privacy's DP-Adam, see the driver's docstring), and time warm-up and timed lots
(:func:`time_method`), resuming from a checkpoint of the lots timed so far (:func:`measure`).
The child prints what :func:`worker` returns as the one result line of :mod:`dpcore.runs.workers`
(torch-free, like this module); its progress goes to stderr.
Also the configuration both sides share (:class:`TfPrivacyConfig`, :data:`METHODS`).

What does not depend on the TensorFlow version (the lots and timing loop :func:`time_lots`,
the resumable measurement :func:`measure_lots`; the model and the machine description come
from :mod:`dpcore.runs.tf_cells`) is also used by the dpcore TF timing
(:mod:`~reproductions.bu2021_jl.dpcore_tf_worker`, TensorFlow >= 2.16 with Keras 3); only the
optimizers and :func:`configure_tensorflow` are TF Privacy's (TensorFlow 2.15).
TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.atomic import atomic_write_text
from dpcore.runs.tf_cells import imdb_lstm as build_model
from dpcore.runs.tf_cells import proc_value, tensorflow_environment
from reproductions.bu2021_jl import config as paper

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


# ----------------------------------------------------------------------------- TensorFlow side


def configure_tensorflow(threads: int) -> dict[str, Any]:
    """:func:`tensorflow_environment` and TF Privacy's version (its environment: TF 2.15)."""
    environment = tensorflow_environment(threads)
    import tensorflow_privacy

    return {**environment, "tensorflow_privacy": tensorflow_privacy.__version__}


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


def time_lots(
    step: Callable[[Any, Any], Any],
    config: Any,
    data: tuple[np.ndarray, np.ndarray],
    *,
    warmup: int,
    lots: int,
    on_lot: Callable[[float], None] | None = None,
) -> list[float]:
    """Seconds of each of ``lots`` timed calls of ``step(inputs, targets)`` after ``warmup``.

    Lots are consecutive slices of ``config.lot_size`` reviews of one permutation of the
    training set seeded by ``config.seed`` (the same lots for every method); targets are a
    float32 column. Each timed lot is one call of the compiled step, ended by reading its
    returned loss back (so the step has finished); ``on_lot`` receives each lot's seconds as
    it is measured. Any TensorFlow 2.
    """
    import tensorflow as tf

    x, y = data
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


def time_method(
    method: str,
    config: TfPrivacyConfig,
    data: tuple[np.ndarray, np.ndarray],
    *,
    warmup: int,
    lots: int,
    on_lot: Callable[[float], None] | None = None,
) -> list[float]:
    """Seconds of each of ``lots`` timed lots of ``method`` after ``warmup`` untimed ones
    (:func:`time_lots` of a ``tf.function`` step with the method's optimizer)."""
    import tensorflow as tf

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

    return time_lots(step, config, data, warmup=warmup, lots=lots, on_lot=on_lot)


# ----------------------------------------------------------------------------- worker side


def _wanted(method: str, config: TfPrivacyConfig) -> int:
    return config.dp_lots if method in DP_METHODS else config.nonprivate_lots


def _stored(path: Path | None) -> list[float]:
    if path is None or not path.is_file():
        return []
    return [float(seconds) for seconds in json.loads(path.read_text())["step_seconds"]]


def measure_lots(
    label: str,
    timer: Callable[..., list[float]],
    *,
    warmup: int,
    wanted: int,
    checkpoint: Path | None,
) -> list[float]:
    """``wanted`` timed lots, resuming ``checkpoint``: ``timer(warmup=, lots=, on_lot=)`` times
    the missing ones (after ``warmup`` untimed lots), each saved to ``checkpoint`` as it comes.

    A progress bar named ``label`` goes to stderr (a worker's stdout carries its result line).
    """
    from tqdm import tqdm

    done = _stored(checkpoint)[:wanted]
    if len(done) >= wanted:
        return done
    bar = tqdm(total=wanted, initial=len(done), desc=label, unit="lot")

    def record(seconds: float) -> None:
        done.append(seconds)
        bar.update(1)
        bar.set_postfix_str(f"{seconds:.2f} s")
        if checkpoint is not None:
            atomic_write_text(
                checkpoint, json.dumps({"method": label, "step_seconds": done}) + "\n"
            )

    bar.write(f"{label}: {warmup} warm-up lot(s), then {wanted - len(done)} timed", sys.stderr)
    timer(warmup=warmup, lots=wanted - len(done), on_lot=record)
    bar.close()
    return done


def measure(
    method: str,
    config: TfPrivacyConfig,
    data: tuple[np.ndarray, np.ndarray],
    checkpoint: Path | None,
    timer: Callable[..., list[float]] | None = None,
) -> list[float]:
    """Timed lots of one method (``timer``: :func:`time_method`), resuming ``checkpoint``."""
    time_it = timer or time_method

    def timed(**lots: Any) -> list[float]:
        return time_it(method, config, data, **lots)

    warmup = config.dp_warmup if method in DP_METHODS else config.nonprivate_warmup
    return measure_lots(
        method, timed, warmup=warmup, wanted=_wanted(method, config), checkpoint=checkpoint
    )


def _peak_rss_mb() -> float | None:
    """This process's peak resident memory (``VmHWM``, Linux), in MiB."""
    peak = proc_value("/proc/self/status", "VmHWM")  # e.g. "1234 kB"
    return None if peak is None else round(int(peak.split()[0]) / 1024, 1)


def worker(
    method: str, config: TfPrivacyConfig, data_path: Path, checkpoint: Path | None
) -> dict[str, Any]:
    """Time ``method`` in this fresh process; the dictionary :func:`.run_worker` reads back."""
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
