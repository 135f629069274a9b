"""Runs in the TF Privacy environment (TF 2.15 + TF Privacy 0.9, no torch): trains audit tasks
with ``DPKerasSGDOptimizer`` and ``model.fit`` as TF Privacy's tutorials do (the task's model
from its spec: Dense layers at the task's initial parameters), and writes each parameter trace.

Protocol (one line each way per task, on stdin/stdout): the parent writes the path of a task
``.npz``; the worker trains, writes ``<path>.out.npz`` (``weights``: (T + 1, d); ``lots``:
(T, B), the records of each batch; ``epsilon``, ``sampling_probability``, ``batch_size``) and
answers ``ok <path>`` or ``error <message>``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np


def train(path: str) -> None:
    """Train the task stored at ``path``; write its trace beside it."""
    import tensorflow as tf
    from tensorflow_privacy import DPKerasSGDOptimizer
    from tensorflow_privacy.privacy.analysis.compute_dp_sgd_privacy_lib import (
        compute_dp_sgd_privacy,
    )

    from dpcore.auditing.models import ModelSpec

    task = np.load(path)
    x, y, w0 = task["features"], task["targets"], task["initial_weight"]
    seed, steps = int(task["seed"]), int(task["steps"])
    n, batch = x.shape[0], int(task["batch_size"])
    spec = ModelSpec(
        tuple(int(v) for v in task["layers"]),
        bias=bool(task["bias"]),
        activation=str(task["activation"]),
        loss=str(task["loss"]),
    )
    tf.keras.utils.set_random_seed(seed)
    activation = {"relu": "relu", "tanh": "tanh", "identity": None}[spec.activation]
    sizes = spec.layers[1:]
    model = tf.keras.Sequential(
        [tf.keras.Input(shape=(spec.layers[0],))]
        + [
            tf.keras.layers.Dense(
                size, use_bias=spec.bias, activation=activation if i < len(sizes) - 1 else None
            )
            for i, size in enumerate(sizes)
        ]
    )
    tensors = spec.unflatten(w0.astype(np.float64))
    step = 2 if spec.bias else 1
    for layer, first in zip(model.layers, range(0, len(tensors), step), strict=True):
        # Keras kernels are (inputs, outputs): the transpose of the canonical (torch) layout
        layer.set_weights([tensors[first].T, *tensors[first + 1 : first + step]])

    def vector() -> np.ndarray:
        parts = []
        for layer in model.layers:
            kernel, *rest = layer.get_weights()
            parts += [kernel.T.reshape(-1), *[b.reshape(-1) for b in rest]]
        return np.concatenate(parts).astype(np.float64)

    optimizer = DPKerasSGDOptimizer(
        l2_norm_clip=float(task["max_grad_norm"]),
        noise_multiplier=float(task["noise_multiplier"]),
        num_microbatches=batch,  # one example per microbatch: per-example clipping
        learning_rate=float(task["learning_rate"]),
    )

    class HalfSquared(tf.keras.losses.Loss):
        """(z - y)^2 / 2, one value per example (TF Privacy needs the vector, not its mean)."""

        def call(self, targets: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
            # Keras hands targets as (B, 1): flatten both, or they broadcast to (B, B)
            flat = tf.reshape(outputs, [-1]) - tf.reshape(tf.cast(targets, outputs.dtype), [-1])
            return 0.5 * tf.square(flat)

    loss: tf.keras.losses.Loss = HalfSquared(reduction=tf.keras.losses.Reduction.NONE)
    if spec.loss == "cross_entropy":
        loss = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE
        )
    model.compile(optimizer=optimizer, loss=loss)
    trace = [vector()]

    class Trace(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index: int, logs: object = None) -> None:
            trace.append(vector())

    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(n, seed=seed, reshuffle_each_iteration=True)
        .batch(batch, drop_remainder=True)  # microbatches must divide every batch
        .repeat()
    )
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Trace()])
    # The records of each batch: the same shuffle (same seeds, same element count) over the
    # record indices. The auditor checks it: lots that do not match the trace fail its tests.
    indices = (
        tf.data.Dataset.range(n)
        .shuffle(n, seed=seed, reshuffle_each_iteration=True)
        .batch(batch, drop_remainder=True)
        .repeat()
    )
    lots = np.stack([b.numpy() for b in indices.take(steps)])
    epsilon = np.nan
    if bool(task["report_epsilon"]):
        epsilon, _ = compute_dp_sgd_privacy(
            n=n,
            batch_size=batch,
            noise_multiplier=float(task["noise_multiplier"]),
            epochs=steps * batch / n,
            delta=float(task["delta"]),
        )
    np.savez(
        path + ".out.npz",
        weights=np.stack(trace),
        lots=lots,
        epsilon=float(epsilon),
        sampling_probability=batch / n,
        batch_size=batch,
    )


def main() -> None:
    """Serve tasks from stdin until it closes."""
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        try:
            train(path)
            print(f"ok {path}", flush=True)
        except Exception as error:  # reported to the parent, which raises
            print(f"error {type(error).__name__}: {error}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
