"""Worker side of :mod:`reproductions.bu2021_jl.dpcore_tf_timing`: Keras 3 steps and timing.

Each method is timed in its own child process, ``python -m
reproductions.bu2021_jl.dpcore_tf_timing --worker ...`` (started by
:func:`~reproductions.bu2021_jl.dpcore_tf_timing.run_worker`), which calls :func:`worker`:
configure TensorFlow's threads, build the IMDb LSTM and the method's step
(:func:`dpcore.runs.tf_cells.keras_step`),
and time warm-up and timed lots, resuming from a checkpoint of the lots timed so far. The model,
the lots, the timing loop and the checkpointed measurement are the TF Privacy baseline's
(:mod:`~reproductions.bu2021_jl.tf_privacy_worker`, imported); only the steps differ. The child
prints what :func:`worker` returns as the one result line of :mod:`dpcore.runs.workers`; its
progress goes to stderr. Also the configuration both sides share (:class:`DpcoreTfConfig`,
:data:`METHODS`). TensorFlow and dpcore's TensorFlow backend are imported only inside functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.runs.tf_cells import error_text, keras_step, tensorflow_environment
from dpcore.runs.tf_cells import imdb_lstm as build_model
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.tf_privacy_worker import (
    _peak_rss_mb,
    _stored,
    measure_lots,
    time_lots,
)

__all__ = [
    "DP_METHODS",
    "METHODS",
    "DpcoreTfConfig",
    "clipping_of",
    "method_key",
    "time_method",
    "worker",
]

#: Row names, in the order they are timed: the Keras 3 (TensorFlow >= 2.16) non-private
#: reference, then dpcore's TensorFlow DP-Adam with exact clipping and with JL norms (one row
#: per r). Distinct from the TF Privacy baseline's ``keras_nonprivate`` (Keras 2, TF 2.15).
METHODS = ("keras3_nonprivate", "dpcore_tf_exact", "dpcore_tf_jl")
DP_METHODS = frozenset(METHODS[1:])


@dataclasses.dataclass(frozen=True)
class DpcoreTfConfig:
    """One profile of the dpcore TF timing: the TF Privacy baseline's model, lots and optimizer
    (paper values from Bu et al. 2021, §5), with dpcore's clipping."""

    profile: str = "quick"
    dataset_size: int = paper.IMDB_TRAIN_SIZE
    lot_size: int = paper.IMDB_LOT
    vocab_size: int = 8000
    sequence_length: int = 150
    embedding_dim: int = 64
    hidden_size: int = 64
    learning_rate: float = 1e-3
    max_grad_norm: float = paper.MAX_GRAD_NORM
    noise_multiplier: float = paper.NOISE_MULTIPLIER
    #: The r of the ``dpcore_tf_jl`` rows (the paper's Table 2 has 1, 5, 10, 30).
    jl_dimensions: tuple[int, ...] = (1, 5)
    #: Untimed lots before the non-private and before each DP method's timed lots (the first
    #: lot traces the ``tf.function``).
    nonprivate_warmup: int = 2
    dp_warmup: int = 1
    #: Timed lots: non-private, and each DP method (extrapolated to an epoch).
    nonprivate_lots: int = 10
    dp_lots: int = 3
    #: TensorFlow intra- and inter-op threads; 0: every core.
    threads: int = 0
    #: Seconds after which a method's worker is stopped (its row keeps the error); None: never.
    timeout: float | None = None
    seed: int = 0


def method_key(method: str, r: int | None = None) -> str:
    """The name of one timed method in checkpoints, errors and progress: ``method[_r<r>]``.

    Example:
        >>> method_key("dpcore_tf_jl", 5), method_key("dpcore_tf_exact")
        ('dpcore_tf_jl_r5', 'dpcore_tf_exact')
    """
    if method not in METHODS:
        raise InvalidParameterError("method", f"one of {METHODS}", method)
    if (method == "dpcore_tf_jl") != (r is not None):
        raise InvalidParameterError("r", "given exactly for dpcore_tf_jl", r)
    return method if r is None else f"{method}_r{r}"


# ----------------------------------------------------------------------------- TensorFlow side


def _step(method: str, config: DpcoreTfConfig, r: int | None) -> tuple[Any, Any]:
    import keras

    return keras_step(
        build_model(config),
        private=method in DP_METHODS,
        optimizer=keras.optimizers.Adam(learning_rate=config.learning_rate),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        jl_dimension=r,
        max_grad_norm=config.max_grad_norm,
        noise_multiplier=config.noise_multiplier,
        expected_lot_size=config.lot_size,
        seed=config.seed,
    )


def time_method(
    method: str,
    config: DpcoreTfConfig,
    data: tuple[np.ndarray, np.ndarray],
    *,
    r: int | None = None,
    warmup: int,
    lots: int,
    on_lot: Callable[[float], None] | None = None,
) -> list[float]:
    """Seconds of ``lots`` timed lots of ``method`` (r: the JL dimension) after ``warmup``
    (the TF Privacy baseline's :func:`~.tf_privacy_worker.time_lots`: the same lots)."""
    _, step = _step(method, config, r)
    return time_lots(step, config, data, warmup=warmup, lots=lots, on_lot=on_lot)


def clipping_of(method: str, config: DpcoreTfConfig, r: int | None = None) -> str | None:
    """The clipping dpcore chooses for ``method`` on the model: ``ghost`` or ``jacobian``
    (exact), ``jl``; None for the non-private step."""
    if method not in DP_METHODS:
        return None
    model, _ = _step(method, config, r)
    return str(model.clipping_method)


# ----------------------------------------------------------------------------- worker side


def _wanted(method: str, config: DpcoreTfConfig) -> int:
    return config.dp_lots if method in DP_METHODS else config.nonprivate_lots


def worker(
    method: str,
    config: DpcoreTfConfig,
    data_path: Path,
    checkpoint: Path | None,
    r: int | None = None,
) -> dict[str, Any]:
    """Time ``method`` (r for ``dpcore_tf_jl``) in this fresh process; the dictionary
    :func:`.dpcore_tf_timing.run_worker` reads back.

    An exception while timing is returned as ``error`` (:func:`error_text`) with the lots timed
    before it, so the driver can say what failed (a crash would leave only an exit status).
    """
    key = method_key(method, r)
    environment = tensorflow_environment(config.threads)
    warmup = config.dp_warmup if method in DP_METHODS else config.nonprivate_warmup
    seconds: list[float] = []
    error = None
    with np.load(data_path) as stored:
        data = (stored["x"], stored["y"])

        def timed(**lots: Any) -> list[float]:
            return time_method(method, config, data, r=r, **lots)

        try:
            seconds = measure_lots(
                key, timed, warmup=warmup, wanted=_wanted(method, config), checkpoint=checkpoint
            )
        except Exception as failure:  # reported in the result line, not raised
            error = error_text(failure)
            seconds = _stored(checkpoint)
    return {
        "step_seconds": seconds,
        "environment": environment,
        "parameters": int(build_model(config).count_params()),
        "clipping": None if error else clipping_of(method, config, r),
        "peak_rss_mb": _peak_rss_mb(),
        "error": error,
    }
