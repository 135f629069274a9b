"""TensorFlow measuring cells: the thread set-up, a Keras or dpcore.tf step, a one-line error.

What TensorFlow timing workers share, whatever study starts them (the TensorFlow training
benchmark, the Bu et al. 2021 timings of TF Privacy and of dpcore's TensorFlow backend):
:func:`tensorflow_environment` fixes the thread pools and describes the machine,
:func:`imdb_lstm` builds the TF Privacy tutorial's IMDb model, :func:`keras_step` makes one
compiled optimizer step (Keras's own, or :class:`dpcore.tf.DPModel`'s), and :func:`error_text`
turns an exception (TensorFlow's graph errors included) into one line for a result row.

Only the standard library is imported here; TensorFlow, Keras and numpy inside the functions,
so a worker of any TensorFlow version (2.15 with Keras 2, or >= 2.16 with Keras 3) uses it.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "ImdbSizes",
    "cpu_name",
    "error_text",
    "imdb_lstm",
    "keras_step",
    "proc_value",
    "tensorflow_environment",
]


class ImdbSizes(Protocol):
    """The sizes :func:`imdb_lstm` reads (a study's config dataclass has them)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def sequence_length(self) -> int: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def seed(self) -> int: ...


def proc_value(path: str, key: str) -> str | None:
    """The value of ``key`` in a ``/proc`` file such as ``/proc/meminfo`` (Linux); else None.

    Example:
        >>> proc_value("/nonexistent", "MemTotal") is None
        True
    """
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name and the RAM (``/proc``; the machine type where it is absent)."""
    memory = proc_value("/proc/meminfo", "MemTotal")  # e.g. "24683464 kB"
    ram = f", {int(memory.split()[0]) / 2**20:.1f} GiB RAM" if memory else ""
    return (proc_value("/proc/cpuinfo", "model name") or platform.machine()) + ram


def tensorflow_environment(threads: int) -> dict[str, Any]:
    """Import TensorFlow with ``threads`` intra-/inter-op threads; its versions and hardware.

    Must run before any TensorFlow operation (the thread pools are fixed at the first one).
    Any TensorFlow 2 (2.15 with Keras 2, or >= 2.16 with Keras 3).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    gpus = [device.name for device in tf.config.list_physical_devices("GPU")]
    where = f"GPU {', '.join(gpus)}" if gpus else f"CPU {cpu_name()}"
    return {
        "hardware": f"{where}, {threads} TensorFlow thread(s) of {os.cpu_count()} cores",
        "gpus": gpus,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }


def imdb_lstm(sizes: ImdbSizes) -> Any:
    """The TF Privacy tutorial's bidirectional LSTM on IMDb reviews, built and seeded.

    Embedding, bidirectional LSTM, a ReLU dense layer and one logit; ``sizes`` gives
    ``vocab_size``, ``sequence_length``, ``embedding_dim``, ``hidden_size`` and ``seed``.
    """
    import tensorflow as tf

    tf.keras.utils.set_random_seed(sizes.seed)
    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(sizes.sequence_length,), dtype="int32"),
            layers.Embedding(sizes.vocab_size, sizes.embedding_dim),
            layers.Bidirectional(layers.LSTM(sizes.hidden_size)),
            layers.Dense(sizes.hidden_size, activation="relu"),
            layers.Dense(1),
        ]
    )


def keras_step(
    net: Any,
    *,
    private: bool,
    optimizer: Any,
    loss: Any,
    jl_dimension: int | None = None,
    max_grad_norm: float = 1.0,
    noise_multiplier: float = 1.0,
    expected_lot_size: float = 256,
    dataset_size: int = 25_000,
    seed: int = 0,
) -> tuple[Any, Callable[[Any, Any], Any]]:
    """``(model, step)``: one ``tf.function`` optimizer step of Keras's own ``train_step``.

    Not ``private``: ``net`` compiled with ``optimizer`` and ``loss`` (Keras's mean loss).
    ``private``: :class:`dpcore.tf.DPModel` around ``net`` (C = ``max_grad_norm``, sigma =
    ``noise_multiplier``; exact clipping, or JL norms with ``jl_dimension`` = r), the noisy sum
    divided by ``expected_lot_size`` as ``fit`` on Poisson lots of that expected size does
    (Abadi et al. 2016, Alg. 1). ``step(inputs, targets)`` returns the lot's mean loss.
    """
    import numpy as np
    import tensorflow as tf

    from dpcore.tf import DPModel

    model = net
    if private:
        model = DPModel(
            net,
            max_grad_norm=max_grad_norm,
            noise_multiplier=noise_multiplier,
            jl_dimension=jl_dimension,
            seed=seed,
        )
    model.compile(optimizer=optimizer, loss=loss)
    if private:
        # fit() takes q and the divisor from its Poisson lots; the timed lots are fixed-size
        from dpcore.tf import PoissonLots

        model.use_lots(PoissonLots(np.zeros(dataset_size), expected_lot_size=expected_lot_size))

    def step(inputs: Any, targets: Any) -> Any:
        return model.train_step((inputs, targets))["loss"]

    compiled: Callable[[Any, Any], Any] = tf.function(step)
    return model, compiled


def error_text(error: BaseException, limit: int = 1000) -> str:
    r"""``Type: message`` of ``error`` on one line, without terminal colours, at most ``limit``
    characters. A TensorFlow graph error lists the user-code frames (``File "...", line N``
    and its code line) before what went wrong: only what follows the last frame is kept.

    Example:
        >>> error_text(TypeError("in user code:\n\n  \x1b[1m`dtype` variant\x1b[0m\n"))
        'TypeError: in user code: `dtype` variant'
        >>> error_text(TypeError('in user code:\n  File "a.py", line 1, in f *\n    f(x)\n'
        ...                      'TypeError: LSTM.call() failed.\n  `dtype` variant'))
        'TypeError: LSTM.call() failed. `dtype` variant'
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    frames = [index for index, line in enumerate(lines) if line.startswith('File "')]
    if frames and len(lines) > frames[-1] + 2:
        lines = lines[frames[-1] + 2 :]
    message = " ".join(" ".join(lines).split())
    name = type(error).__name__
    return (message if message.startswith(f"{name}: ") else f"{name}: {message}")[:limit]
