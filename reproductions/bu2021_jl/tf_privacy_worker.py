"""Worker side of :mod:`reproductions.bu2021_jl.tf_privacy_baseline`: TensorFlow model and timing.

Each method is timed in its own child process, ``python -m
reproductions.bu2021_jl.tf_privacy_baseline --worker ...`` (started by
:func:`~reproductions.bu2021_jl.tf_privacy_baseline.run_worker`), which calls :func:`worker`:
configure TensorFlow's threads, build the tutorial's bidirectional LSTM and the optimizer (Keras
Adam or TF Privacy's DP-Adam, see the driver's docstring), and time warm-up and timed lots
(:func:`time_method`), resuming from a checkpoint of the lots timed so far (:func:`measure`).
The child prints what :func:`worker` returns as the one result line of :mod:`bench.protocol`
(torch-free, like this module); its progress goes to stderr.
Also the configuration both sides share (:class:`TfPrivacyConfig`, :data:`METHODS`).
TensorFlow is imported only inside functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.cache import atomic_write_text
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
    """The tutorial's bidirectional LSTM (see :mod:`.tf_privacy_baseline`), built and seeded."""
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


# ----------------------------------------------------------------------------- worker side


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
            atomic_write_text(
                checkpoint, json.dumps({"method": method, "step_seconds": done}) + "\n"
            )

    warmup = config.dp_warmup if method in DP_METHODS else config.nonprivate_warmup
    # stderr, like the bar: a worker's stdout carries its result line
    bar.write(f"{method}: {warmup} warm-up lot(s), then {wanted - len(done)} timed", sys.stderr)
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
