"""Small Keras models shared by the TensorFlow tests, and a one-example-at-a-time reference.

``dtype`` is per layer (never the global ``floatx``), so float64 and float32 tests can mix.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["MODELS", "build", "loop_reference", "lot", "sparse_loss", "tf_privacy_cnn"]


def sparse_loss(dtype: str = "float64") -> keras.losses.Loss:
    """Keras losses compute in their own dtype (float32 by default): give the model's."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype=dtype)


def tf_privacy_cnn(hidden: int = 32) -> keras.Model:
    """The TF Privacy tutorial CNN in Keras (26,010 parameters at ``hidden = 32``), as
    :func:`dpcore.torch.models.tf_privacy_mnist_cnn` on NHWC images."""
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2, strides=1),
            keras.layers.Conv2D(32, 4, strides=2, activation="relu"),
            keras.layers.MaxPooling2D(2, strides=1),
            keras.layers.Flatten(),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _mlp(dtype: str) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((5,), dtype=dtype),
            keras.layers.Dense(7, activation="tanh", dtype=dtype),
            keras.layers.LayerNormalization(dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )


def _cnn(dtype: str) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 2), dtype=dtype),
            keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu", dtype=dtype),
            keras.layers.MaxPooling2D(2, strides=1, dtype=dtype),
            keras.layers.Conv2D(3, 2, dtype=dtype),
            keras.layers.Flatten(dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )


def _text(dtype: str) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(10, 4, dtype=dtype),
            keras.layers.Conv1D(
                3, 3, padding="same", dilation_rate=2, activation="relu", dtype=dtype
            ),
            keras.layers.Dense(5, dtype=dtype),
            keras.layers.GlobalAveragePooling1D(dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )


def _lstm(dtype: str) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(10, 4, dtype=dtype),
            keras.layers.Bidirectional(
                keras.layers.LSTM(3, return_sequences=True, dtype=dtype), dtype=dtype
            ),
            keras.layers.LSTM(4, dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )


def _gru(dtype: str) -> keras.Model:  # no ghost norm: the Jacobian path
    return keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(10, 4, dtype=dtype),
            keras.layers.GRU(3, dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )


#: name -> (builder, input shape without the batch, integer inputs?, ghost-covered?)
MODELS: dict[str, tuple[Any, tuple[int, ...], bool, bool]] = {
    "mlp": (_mlp, (5,), False, True),
    "cnn": (_cnn, (8, 8, 2), False, True),
    "text": (_text, (6,), True, True),
    "lstm": (_lstm, (6,), True, True),
    "gru": (_gru, (6,), True, False),
}


def build(name: str, dtype: str = "float64", seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return MODELS[name][0](dtype)


def lot(name: str, size: int, dtype: str = "float64", seed: int = 1) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    _, shape, integer, _ = MODELS[name]
    x = rng.integers(0, 10, (size, *shape)) if integer else rng.normal(size=(size, *shape))
    inputs = tf.constant(x, tf.int32 if integer else dtype)
    return inputs, tf.constant(rng.integers(0, 3, size), tf.int64)


def loop_reference(
    model: keras.Model, loss: Any, x: tf.Tensor, y: tf.Tensor, max_grad_norm: float
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per-example norms and the clipped sum, one example at a time with ``GradientTape``."""
    norms, total = [], None
    for i in range(int(x.shape[0])):
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(loss(y[i : i + 1], model(x[i : i + 1], training=False)))
        grads = [
            tf.convert_to_tensor(g).numpy() for g in tape.gradient(value, model.trainable_weights)
        ]
        norm = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)))
        factor = min(1.0, max_grad_norm / norm) if norm > 0 else 1.0
        norms.append(norm)
        scaled = [factor * g for g in grads]
        total = scaled if total is None else [a + b for a, b in zip(total, scaled, strict=True)]
    if total is None:
        total = [np.zeros(w.shape) for w in model.trainable_weights]
    return np.array(norms), total
